package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrDrainCut is returned by Run when the drain was cut short: calls were
// still in flight at Config.ShutdownTimeout and were closed unanswered
// (gRPC calls, held waits among them, get UNAVAILABLE; HTTP requests a
// closed connection). The shutdown is otherwise complete.
var ErrDrainCut = errors.New("drain cut short: calls still in flight at the shutdown timeout were closed")

// drain answers the calls in flight, for at most Config.ShutdownTimeout,
// then closes the gRPC, HTTP and extra servers; it returns an error
// wrapping ErrDrainCut, naming the servers, if calls were still in flight
// when the timeout came and had to be closed, else nil.
func (d *Daemon) drain() error {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	drained := make(chan struct{})
	go func() {
		d.grpc.GracefulStop()
		close(drained)
	}()
	var cut []string
	select {
	case <-drained:
	case <-ctx.Done():
		d.log.Warn("in-flight calls did not finish in time; closing them")
		d.grpc.Stop()
		<-drained
		cut = append(cut, "gRPC")
	}
	if err := d.http.Shutdown(ctx); err != nil {
		d.http.Close()
		cut = append(cut, "HTTP")
	}
	d.shutdownExtra(ctx)
	if len(cut) == 0 {
		return nil
	}
	return fmt.Errorf("%w (%s; --shutdown-timeout %v)", ErrDrainCut, strings.Join(cut, " and "), d.cfg.ShutdownTimeout)
}
