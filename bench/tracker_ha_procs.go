package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// buildKiln builds the kiln command into dir and returns its path.
func buildKiln(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "kiln")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kiln-ml/kiln/cmd/kiln").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build kiln: %v\n%s", err, out)
	}
	return bin, nil
}

// freePort returns a loopback address that was free a moment ago.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// trackerProc is a `kiln tracker` process on loopback.
type trackerProc struct {
	bin, addr, logPath string
	args               []string
	mu                 sync.Mutex
	cmd                *exec.Cmd
	exited             chan struct{}
}

// startTrackerProc starts `kiln tracker --listen addr args...`, its output
// in logPath; it does not wait for it to serve.
func startTrackerProc(bin, addr, logPath string, args ...string) (*trackerProc, error) {
	p := &trackerProc{bin: bin, addr: addr, logPath: logPath, args: args}
	return p, p.start()
}

func (p *trackerProc) start() error {
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("tracker log: %w", err)
	}
	cmd := exec.Command(p.bin, append([]string{"tracker", "--listen", p.addr}, p.args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start tracker: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		log.Close()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

// kill sends SIGKILL (or sig) and waits for the process to end.
func (p *trackerProc) kill(sig syscall.Signal) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
	}
}

// stop ends the process (SIGTERM, then SIGKILL after 30 s).
func (p *trackerProc) stop() { p.kill(syscall.SIGTERM) }

// logTail returns the end of the process's log, for error messages.
func (p *trackerProc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// waitServing waits until a client can query one of the trackers of list.
func waitServing(ctx context.Context, list, token string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for {
		tc, err := client.DialTracker(ctx, list, client.TrackerOptions{Token: token, Logger: quiet})
		if err == nil {
			_, err = tc.Query(ctx, 1)
			tc.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("trackers %s not serving within %s: %w", list, within, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fleet is simulated device daemons: one Registrar each, failing over
// between the trackers of a list as real daemons do.
type fleet struct {
	regs   []*client.Registrar
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFleet registers devices devices under keys keys and waits until
// every one is registered.
func startFleet(ctx context.Context, list, token string, devices, keys int) (*fleet, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{cancel: cancel}
	for i := range devices {
		r := client.NewRegistrar(list, client.TrackerOptions{Token: token, Logger: quiet}, proto.RegisterArgs{
			Role: proto.NodeDevice, Key: fmt.Sprintf("key%d", i%keys), Addr: fmt.Sprintf("10.0.%d.%d:9090", i/256, i%256),
		})
		f.regs = append(f.regs, r)
		f.wg.Go(func() { r.Run(ctx) })
	}
	for _, r := range f.regs {
		select {
		case <-r.Ready():
		case <-ctx.Done():
			f.stop()
			return nil, fmt.Errorf("register %d devices: %w", devices, ctx.Err())
		case <-time.After(2 * time.Minute):
			f.stop()
			return nil, errors.New("devices did not register within 2 minutes")
		}
	}
	return f, nil
}

func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
}

// startCluster starts n trackers, each with an embedded etcd member
// (--cluster-name, --cluster-peers) that is its store, sharing one
// artifact directory, and returns them with the address list of all.
func startCluster(bin, dir string, n int, common []string) ([]*trackerProc, string, error) {
	var names, peers, clients, listens []string
	for i := range n {
		var addrs [3]string
		for k := range addrs {
			a, err := freePort()
			if err != nil {
				return nil, "", err
			}
			addrs[k] = a
		}
		name := fmt.Sprintf("t%d", i)
		names = append(names, name)
		listens = append(listens, addrs[0])
		peers = append(peers, name+"=https://"+addrs[1]) // members speak mutual TLS only
		clients = append(clients, "https://"+addrs[2])
	}
	var procs []*trackerProc
	for i := range n {
		d := filepath.Join(dir, names[i])
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, "", err
		}
		args := append([]string{"--data", filepath.Join(d, "data"), "--artifacts", filepath.Join(dir, "artifacts"), "--advertise", listens[i],
			"--cluster-name", names[i], "--cluster-peers", strings.Join(peers, ","), "--cluster-client-url", clients[i]}, common...)
		p, err := startTrackerProc(bin, listens[i], filepath.Join(d, "tracker.log"), args...)
		if err != nil {
			for _, p := range procs {
				p.stop()
			}
			return nil, "", err
		}
		procs = append(procs, p)
	}
	return procs, strings.Join(listens, ","), nil
}

// leaderOf returns the tracker whose log last named itself the leader
// ("tracker leader … self=true"), waiting up to within for one.
func leaderOf(ctx context.Context, procs []*trackerProc, within time.Duration) (*trackerProc, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, p := range procs {
			if p.alive() && p.saysLeader() {
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("no tracker says it leads within %s", within)
}

// saysLeader reports whether the last leader its log names is itself.
func (p *trackerProc) saysLeader() bool {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "tracker leader") {
			return strings.Contains(lines[i], "self=true")
		}
	}
	return false
}

// alive reports whether the process runs.
func (p *trackerProc) alive() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// firstLogAfter returns the time (the time= field) of the earliest line
// containing what in the logs of procs that is after t.
func firstLogAfter(procs []*trackerProc, what string, t time.Time) (time.Time, bool) {
	var first time.Time
	for _, p := range procs {
		b, _ := os.ReadFile(p.logPath)
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, what) {
				continue
			}
			f, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, f)
			if err == nil && at.After(t) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}
	return first, !first.IsZero()
}
