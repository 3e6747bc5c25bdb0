// Package ui is the tracker's web console: server-rendered pages of the
// fleet (devices, their health, leases and queues), the build jobs, the
// tuning runs and the results store, each updated live by a small script
// that polls the page's JSON form.
//
// A visitor logs in with a kiln token (a named user token, or the fleet
// token for an administrator). The console then holds, for that session,
// a client connection to the tracker made in memory with that token
// (tracker.Server.DialLocal), and reads every page through it: a page
// shows a user what kiln query and kiln results show them, and never
// another user's private results. The session is an HttpOnly,
// SameSite=Strict cookie (Secure over TLS); the console changes nothing
// in the fleet, and its only state-changing requests (log in, log out)
// are POSTs that must come from its own pages.
//
// Everything it serves is embedded in the binary (templates, styles, the
// chart script); a page loads nothing from elsewhere.
package ui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Tracker is what the console reads the fleet through: *tracker.Server.
type Tracker interface {
	DialLocal(ctx context.Context, token string) (*tracker.LocalClient, error)
}

// Config configures a console.
type Config struct {
	Tracker Tracker
	// TLS, when set, serves HTTPS with it (the tracker's own TLS config)
	// and marks the session cookie Secure.
	TLS *tls.Config
	// SessionTTL is how long a login lasts unused (12h when 0).
	SessionTTL time.Duration
	// MaxSessions bounds the sessions held at once (1024 when 0); a login
	// past it ends the least recently used.
	MaxSessions int
	// Poll is how often a page asks for fresh data (2s when 0).
	Poll time.Duration
	// Logger receives the console's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Server is a console. Its Handler serves the pages; Serve runs it on a
// listener.
type Server struct {
	cfg   Config
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux

	mu       sync.Mutex
	sessions map[string]*session
}

// session is one login: its cookie's id, the token it for forms that
// change state (log out), and the tracker connection made with the
// visitor's token.
type session struct {
	id, csrf string
	lc       *tracker.LocalClient
	used     time.Time
}

const (
	cookiePlain = "kiln_console"
	// cookieTLS carries the __Host- prefix, which a browser accepts only
	// Secure, from HTTPS, for this host alone and for every path.
	cookieTLS = "__Host-kiln_console"
)

// New builds a console over cfg.Tracker.
func New(cfg Config) (*Server, error) {
	if cfg.Tracker == nil {
		return nil, errors.New("console: no tracker")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 1024
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, pages: map[string]*template.Template{}}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		s.pages[base] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", staticHandler(http.FileServerFS(static))))
	m.HandleFunc("GET /login", s.loginForm)
	m.HandleFunc("POST /login", s.login)
	m.HandleFunc("POST /logout", s.logout)
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fleet", http.StatusSeeOther) })
	for path, p := range s.routes() {
		m.Handle("GET "+path, s.authed(p))
		m.Handle("GET /api"+path, s.authed(p))
	}
	s.mux = m
	return s, nil
}

// Handler serves the console.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		if s.cfg.TLS != nil {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		s.mux.ServeHTTP(w, r)
	})
}

// Serve serves the console on ln (over TLS with Config.TLS) until ctx
// ends, then closes every session's tracker connection.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	hs := &http.Server{
		Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
	}()
	go s.reapLoop(ctx)
	err := hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	<-stopped
	s.closeSessions()
	return err
}

func staticHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		h.ServeHTTP(w, r)
	})
}

func (s *Server) cookieName() string {
	if s.cfg.TLS != nil {
		return cookieTLS
	}
	return cookiePlain
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// current returns the request's live session, nil without one. A session
// whose tracker connection ended (its token revoked, the tracker stopped)
// is over.
func (s *Server) current(r *http.Request) *session {
	c, err := r.Cookie(s.cookieName())
	if err != nil || c.Value == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.sessions[c.Value]
	if se == nil {
		return nil
	}
	now := time.Now()
	if now.Sub(se.used) > s.cfg.SessionTTL || se.lc.Err() != nil {
		s.endLocked(se)
		return nil
	}
	se.used = now
	return se
}

func (s *Server) endLocked(se *session) {
	delete(s.sessions, se.id)
	se.lc.Close()
}

func (s *Server) closeSessions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, se := range s.sessions {
		s.endLocked(se)
	}
}

// reapLoop ends the sessions unused past SessionTTL.
func (s *Server) reapLoop(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.mu.Lock()
			for _, se := range s.sessions {
				if now.Sub(se.used) > s.cfg.SessionTTL || se.lc.Err() != nil {
					s.endLocked(se)
				}
			}
			s.mu.Unlock()
		}
	}
}

// sameOrigin refuses a state-changing request that another site's page
// sent: a browser names the page's origin in Origin (and says
// cross-site in Sec-Fetch-Site); a request with neither comes from no
// page at all (curl), which no cookie rides on unbidden.
func sameOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("a %s request from another site (Sec-Fetch-Site %s)", r.Method, site)
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("a %s request from origin %q, not this console (%s)", r.Method, o, r.Host)
		}
	}
	return nil
}

func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) {
	if s.current(r) != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	s.render(w, r, "login", &page{Title: "Log in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}}, http.StatusOK)
}

type loginData struct {
	Next, Error string
}

// safeNext keeps a post-login destination on this console (a path, never
// another host).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.HasPrefix(next, "/api/") {
		return "/fleet"
	}
	return next
}

// maxLoginBody bounds a login form (a token is well under it).
const maxLoginBody = 8 << 10

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		http.Error(w, "log in refused: "+err.Error(), http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "log in: bad form: "+err.Error(), http.StatusBadRequest)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	token := strings.TrimSpace(r.PostForm.Get("token"))
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	lc, err := s.cfg.Tracker.DialLocal(ctx, token)
	if err != nil {
		msg := "the tracker refused this token: " + err.Error()
		if errors.Is(err, proto.ErrUnauthorized) {
			msg = "the tracker does not admit this token (give a user token from kiln token create --user NAME, or the fleet token)"
		}
		s.log.Info("console login refused", "remote", r.RemoteAddr, "err", err)
		s.render(w, r, "login", &page{Title: "Log in", Data: loginData{Next: next, Error: msg}}, http.StatusUnauthorized)
		return
	}
	se := &session{id: randomHex(32), csrf: randomHex(16), lc: lc, used: time.Now()}
	s.mu.Lock()
	for len(s.sessions) >= s.cfg.MaxSessions {
		var oldest *session
		for _, o := range s.sessions {
			if oldest == nil || o.used.Before(oldest.used) {
				oldest = o
			}
		}
		s.endLocked(oldest)
	}
	s.sessions[se.id] = se
	s.mu.Unlock()
	s.log.Info("console login", "user", displayUser(lc), "remote", r.RemoteAddr)
	http.SetCookie(w, &http.Cookie{
		Name: s.cookieName(), Value: se.id, Path: "/", HttpOnly: true, Secure: s.cfg.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int(s.cfg.SessionTTL.Seconds()),
	})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		http.Error(w, "log out refused: "+err.Error(), http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	se := s.current(r)
	if se != nil {
		if err := r.ParseForm(); err != nil || subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(se.csrf)) != 1 {
			http.Error(w, "log out refused: the form's check token is missing or wrong (log out from the console's own page)", http.StatusForbidden)
			return
		}
		s.mu.Lock()
		s.endLocked(se)
		s.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(), Value: "", Path: "/", HttpOnly: true, Secure: s.cfg.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func displayUser(lc *tracker.LocalClient) string {
	switch {
	case lc.User != "":
		return lc.User
	case lc.Open:
		return "anyone (the tracker checks no token)"
	}
	return "administrator (fleet token)"
}
