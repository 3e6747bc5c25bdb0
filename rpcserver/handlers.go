package rpcserver

import (
	"context"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// forwarded are the methods the daemon passes to the session's worker.
var forwarded = []string{
	proto.ModuleLoad, proto.ModuleGetFunction, proto.GlobalGet, proto.GlobalList,
	proto.FuncCall, proto.FuncTime, proto.ArrayEmpty, proto.HandleFree, proto.DeviceAttrs,
}

// registerHandlers installs the session methods on the daemon's server.
func (d *Daemon) registerHandlers() {
	d.handle(proto.SessionOpen, func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error) {
		var a proto.OpenArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		return s.open(ctx, a)
	})
	d.handle(proto.SessionStatus, func(ctx context.Context, s *session, _ msgpack.RawMessage) (any, error) {
		return nil, s.status(ctx)
	})
	d.handle(proto.SessionClose, func(ctx context.Context, s *session, _ msgpack.RawMessage) (any, error) {
		s.close()
		return nil, nil
	})
	for _, m := range forwarded {
		d.handle(m, func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error) {
			return s.forward(ctx, m, raw)
		})
	}
	d.handle(proto.FileList, func(ctx context.Context, s *session, _ msgpack.RawMessage) (any, error) {
		box, err := s.liveBox()
		if err != nil {
			return nil, err
		}
		return box.List()
	})
	d.handle(proto.FileUploadTicket, func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error) {
		var a proto.UploadTicketArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		return d.issueTicket(s, a)
	})
	d.handle(proto.FileLinkCached, func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error) {
		var a proto.LinkCachedArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		return d.linkCached(s, a)
	})
	d.handle(proto.FileStat, func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error) {
		var a proto.FileArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		box, err := s.liveBox()
		if err != nil {
			return nil, err
		}
		return box.Stat(a.Name)
	})
	d.handle(proto.FileRemove, func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error) {
		var a proto.FileArgs
		if err := decodeArgs(raw, &a); err != nil {
			return nil, err
		}
		box, err := s.liveBox()
		if err != nil {
			return nil, err
		}
		return nil, box.Remove(a.Name)
	})

	d.handleBulk(proto.FileUpload, func(ctx context.Context, s *session, _ *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
		box, err := s.liveBox()
		if err != nil {
			return proto.Bulk{}, err
		}
		if err := box.Upload(ctx, in.Name, in.Size, in.Body, "", nil); err != nil {
			return proto.Bulk{}, err
		}
		d.m.bulkByte.Add(float64(in.Size), proto.FileUpload)
		return proto.Bulk{}, nil
	})
	d.handleBulk(proto.FileDownload, func(ctx context.Context, s *session, _ *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
		box, err := s.liveBox()
		if err != nil {
			return proto.Bulk{}, err
		}
		f, size, err := box.Open(in.Name)
		if err != nil {
			return proto.Bulk{}, fmt.Errorf("download: %w", err)
		}
		return proto.Bulk{Name: in.Name, Size: size, Body: f}, nil
	})
	d.handleBulk(proto.ArrayCopyFrom, func(ctx context.Context, s *session, _ *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
		return s.forwardUpload(ctx, proto.ArrayCopyFrom, in)
	})
	d.handleBulk(proto.ArrayCopyTo, func(ctx context.Context, s *session, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
		return s.forwardDownload(ctx, c, proto.ArrayCopyTo, in)
	})
}

// decodeArgs decodes a request's arguments; failures are bad requests.
func decodeArgs(raw msgpack.RawMessage, v any) error {
	if err := msgpack.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode arguments: %v: %w", err, proto.ErrBadRequest)
	}
	return nil
}

// handle registers a session method with metrics.
func (d *Daemon) handle(method string, fn func(ctx context.Context, s *session, raw msgpack.RawMessage) (any, error)) {
	d.srv.Handle(method, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
		start := time.Now()
		s := sessionOf(c)
		var out any
		var err error
		if s == nil {
			err = fmt.Errorf("%s: no session on this connection: %w", method, proto.ErrInternal)
		} else {
			out, err = fn(ctx, s, raw)
			err = s.relative(err)
		}
		d.observe(method, start, err)
		return out, err
	})
}

// handleBulk registers a bulk session method with metrics.
func (d *Daemon) handleBulk(method string, fn func(ctx context.Context, s *session, c *proto.Conn, in proto.Bulk) (proto.Bulk, error)) {
	d.srv.HandleBulk(method, func(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
		start := time.Now()
		s := sessionOf(c)
		var out proto.Bulk
		var err error
		if s == nil {
			err = fmt.Errorf("%s: no session on this connection: %w", method, proto.ErrInternal)
		} else {
			out, err = fn(ctx, s, c, in)
			err = s.relative(err)
		}
		d.observe(method, start, err)
		return out, err
	})
}

// observe records one request in the metrics.
func (d *Daemon) observe(method string, start time.Time, err error) {
	code := "ok"
	if err != nil {
		code = string(proto.ToWire(err).Code)
	}
	d.m.calls.Inc(method, code)
	d.m.latency.Observe(time.Since(start).Seconds(), method)
}

// relative rewrites err to name no absolute path of the daemon's (see
// relativeErr).
func (s *session) relative(err error) error {
	if err == nil {
		return nil
	}
	s.mu.Lock()
	dir := s.dir
	s.mu.Unlock()
	return relativeErr(err, dir, s.d.cfg.Dir)
}
