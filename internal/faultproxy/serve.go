package faultproxy

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Serve runs proxies for a parent process (see StartRemote), reading one
// command a line from in and writing one answer a line to out, until in
// ends; then it closes every proxy it started. The commands:
//
//	start TARGET        → ok ID ADDR   (Start(TARGET); ID names it from then on)
//	ID pass             → ok           (Pass)
//	ID blackhole        → ok           (Blackhole)
//	ID latency DURATION → ok           (Latency; DURATION as time.ParseDuration reads it)
//	ID reset            → ok           (ResetPeer)
//	ID conns            → ok N         (Conns)
//	ID close            → ok           (Close)
//
// A command that fails answers "err MESSAGE" (one line) and changes
// nothing. It returns the first error writing out, or reading in other
// than its end.
func Serve(in io.Reader, out io.Writer) error {
	proxies := map[string]*Proxy{}
	defer func() {
		for _, p := range proxies {
			p.Close()
		}
	}()
	lines := bufio.NewScanner(in)
	next := 0
	for lines.Scan() {
		answer, err := command(strings.Fields(lines.Text()), proxies, &next)
		if err != nil {
			answer = "err " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		if _, err := fmt.Fprintln(out, answer); err != nil {
			return fmt.Errorf("faultproxy: answer: %w", err)
		}
	}
	if err := lines.Err(); err != nil {
		return fmt.Errorf("faultproxy: read command: %w", err)
	}
	return nil
}

// command runs one command of Serve's and returns its answer.
func command(words []string, proxies map[string]*Proxy, next *int) (string, error) {
	if len(words) == 2 && words[0] == "start" {
		p, err := Start(words[1])
		if err != nil {
			return "", err
		}
		*next++
		id := strconv.Itoa(*next)
		proxies[id] = p
		return "ok " + id + " " + p.Addr(), nil
	}
	if len(words) < 2 {
		return "", fmt.Errorf("faultproxy: command %q: want start TARGET or ID VERB", strings.Join(words, " "))
	}
	p, ok := proxies[words[0]]
	if !ok {
		return "", fmt.Errorf("faultproxy: no proxy %q", words[0])
	}
	switch verb, args := words[1], words[2:]; {
	case verb == "pass" && len(args) == 0:
		p.Pass()
	case verb == "blackhole" && len(args) == 0:
		p.Blackhole()
	case verb == "reset" && len(args) == 0:
		p.ResetPeer()
	case verb == "latency" && len(args) == 1:
		d, err := time.ParseDuration(args[0])
		if err != nil {
			return "", fmt.Errorf("faultproxy: latency: %w", err)
		}
		p.Latency(d)
	case verb == "conns" && len(args) == 0:
		return "ok " + strconv.Itoa(p.Conns()), nil
	case verb == "close" && len(args) == 0:
		delete(proxies, words[0])
		if err := p.Close(); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("faultproxy: command %q: unknown verb or wrong arguments", strings.Join(words, " "))
	}
	return "ok", nil
}
