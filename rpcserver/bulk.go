package rpcserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Uploads on connections of their own (proto.FileUploadTicket): a session
// asks for a ticket, then the client dials again with proto.RoleBulk and
// sends the ticket and the bytes, which go straight from the socket into
// the session's directory, with no multiplexer between.
const (
	// ticketTTL is how long a ticket waits for its connection.
	ticketTTL = 30 * time.Second
	// maxTickets bounds the tickets waiting at once, all sessions together.
	maxTickets = 64
)

// uploadTicket is an upload a session reserved.
type uploadTicket struct {
	s       *session
	name    string
	size    int64
	sum     string // the claimed SHA-256, "" for none
	expires time.Time
}

// issueTicket reserves an upload of a.Size bytes as a.Name for s.
func (d *Daemon) issueTicket(s *session, a proto.UploadTicketArgs) (proto.UploadTicket, error) {
	if _, err := s.liveBox(); err != nil {
		return proto.UploadTicket{}, err
	}
	if _, err := checkName(a.Name); err != nil {
		return proto.UploadTicket{}, fmt.Errorf("upload ticket: %w", err)
	}
	if a.Size < 0 {
		return proto.UploadTicket{}, fmt.Errorf("upload ticket %q: negative size %d: %w", a.Name, a.Size, proto.ErrBadRequest)
	}
	if a.SHA256 != "" {
		if err := checkSum(a.SHA256); err != nil {
			return proto.UploadTicket{}, fmt.Errorf("upload ticket %q: %w", a.Name, err)
		}
	}
	var b [16]byte
	rand.Read(b[:])
	t := hex.EncodeToString(b[:])
	now := time.Now()
	d.tmu.Lock()
	defer d.tmu.Unlock()
	for k, v := range d.tickets {
		if now.After(v.expires) {
			delete(d.tickets, k)
		}
	}
	if len(d.tickets) >= maxTickets {
		return proto.UploadTicket{}, fmt.Errorf("upload ticket %q: %d uploads are waiting for their connections, the limit: %w", a.Name, maxTickets, proto.ErrBusy)
	}
	d.tickets[t] = uploadTicket{s: s, name: a.Name, size: a.Size, sum: a.SHA256, expires: now.Add(ticketTTL)}
	return proto.UploadTicket{Ticket: t}, nil
}

// takeTicket removes and returns a live ticket.
func (d *Daemon) takeTicket(t string) (uploadTicket, bool) {
	d.tmu.Lock()
	defer d.tmu.Unlock()
	v, ok := d.tickets[t]
	delete(d.tickets, t)
	if !ok || time.Now().After(v.expires) {
		return uploadTicket{}, false
	}
	return v, true
}

// serveRaw serves a RoleBulk connection (the ticket frame, the upload,
// and one response frame saying how it went) or a RoleCall connection
// (the ticket frame; then the connection is the worker's).
func (d *Daemon) serveRaw(ctx context.Context, c *proto.Conn, nc net.Conn) error {
	nc.SetReadDeadline(time.Now().Add(proto.DefaultHandshakeTimeout))
	b, err := proto.ReadFrame(nc, 4<<10)
	if err != nil {
		return fmt.Errorf("%s connection: %w", c.Role(), err)
	}
	if c.Role() == proto.RoleCall {
		return d.serveCallConn(nc, b)
	}
	var bt proto.BulkTicket
	if err := msgpack.Unmarshal(b, &bt); err != nil {
		return fmt.Errorf("bulk connection: ticket: %w", err)
	}
	err = d.rawUpload(ctx, nc, bt.Ticket)
	resp := proto.Response{ID: 1, Error: proto.ToWire(err)}
	nc.SetWriteDeadline(time.Now().Add(proto.DefaultHandshakeTimeout))
	if werr := proto.WriteFrame(nc, resp, 0); werr != nil && err == nil {
		err = werr
	}
	return err
}

// rawUpload copies the ticket's bytes from nc into its session's
// directory; the session's end, or the daemon's, cuts it short.
func (d *Daemon) rawUpload(ctx context.Context, nc net.Conn, ticket string) error {
	t, ok := d.takeTicket(ticket)
	if !ok {
		return fmt.Errorf("bulk upload: unknown or expired ticket: %w", proto.ErrUnauthorized)
	}
	box, err := t.s.liveBox()
	if err != nil {
		return err
	}
	nc.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(t.s.c.Context(), func() { nc.Close() })
	defer stop()
	var keep func(*os.File, string)
	if c := d.cache; c != nil && t.sum != "" {
		keep = func(dir *os.File, base string) {
			if err := c.keep(cacheKey{user: t.s.userName(), sum: t.sum}, dir, base, t.size); err != nil {
				t.s.log.Warn("upload not kept by content", "name", t.name, "err", err)
			}
		}
	}
	if err := box.Upload(ctx, t.name, t.size, nc, t.sum, keep); err != nil {
		return err
	}
	d.m.bulkByte.Add(float64(t.size), proto.FileUpload)
	return nil
}

// serveCallConn hands a RoleCall connection to the worker of the session
// whose call ticket its first frame b holds: from then on the worker
// answers it (first with a Response frame, ID 1) and serves its calls, and
// the daemon is off their path. A refusal is answered here.
func (d *Daemon) serveCallConn(nc net.Conn, b []byte) error {
	var ct proto.CallTicket
	err := msgpack.Unmarshal(b, &ct)
	if err != nil {
		err = fmt.Errorf("call connection: ticket: %v: %w", err, proto.ErrBadRequest)
	} else {
		err = d.handCall(nc, ct.Ticket)
	}
	if err == nil {
		return nil
	}
	nc.SetWriteDeadline(time.Now().Add(proto.DefaultHandshakeTimeout))
	proto.WriteFrame(nc, proto.Response{ID: 1, Error: proto.ToWire(err)}, 0)
	return err
}

// handCall passes nc to the worker of the session holding ticket.
func (d *Daemon) handCall(nc net.Conn, ticket string) error {
	d.tmu.Lock()
	s := d.calls[ticket]
	delete(d.calls, ticket)
	d.tmu.Unlock()
	if s == nil || ticket == "" {
		return fmt.Errorf("call connection: unknown or used ticket: %w", proto.ErrUnauthorized)
	}
	w, err := s.live()
	if err != nil {
		return err
	}
	nc.SetReadDeadline(time.Time{})
	if err := w.handoff(nc); err != nil {
		return err
	}
	s.log.Debug("call connection handed to the worker", "remote", nc.RemoteAddr())
	return nil
}

// issueCallTicket gives s a ticket for its call connection.
func (d *Daemon) issueCallTicket(s *session) string {
	var b [16]byte
	rand.Read(b[:])
	t := hex.EncodeToString(b[:])
	d.tmu.Lock()
	defer d.tmu.Unlock()
	d.calls[t] = s
	return t
}

// dropCallTicket forgets s's unused call ticket.
func (d *Daemon) dropCallTicket(t string) {
	if t == "" {
		return
	}
	d.tmu.Lock()
	defer d.tmu.Unlock()
	delete(d.calls, t)
}
