package metrics

import "github.com/ratelimitd/ratelimitd/internal/server"

// Tee returns an Observer that hands each call to every non-nil observer
// in obs, in order. It is safe for concurrent use when they are.
func Tee(obs ...server.Observer) server.Observer {
	var t tee
	for _, o := range obs {
		if o != nil {
			t = append(t, o)
		}
	}
	return t
}

type tee []server.Observer

func (t tee) ObserveCall(c server.Call) {
	for _, o := range t {
		o.ObserveCall(c)
	}
}
