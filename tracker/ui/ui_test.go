package ui_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// browser is an HTTP client with a cookie jar that follows no redirect,
// so each answer can be checked.
func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	check.NoError(t, err)
	return &http.Client{Jar: jar, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	check.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func login(t *testing.T, c *http.Client, base, token string) *http.Response {
	t.Helper()
	resp, err := c.PostForm(base+"/login", url.Values{"token": {token}, "next": {"/results"}})
	check.NoError(t, err)
	resp.Body.Close()
	return resp
}

func TestConsoleLoginAndPrivacy(t *testing.T) {
	f := startFleet(t, time.Second)
	aliceOwn := record(t, f.aliceTracker, "alice_private_fn", "pr-1", false, 1e-3, 1.1e-3, 1.2e-3)
	bobOwn := record(t, f.bobTracker, "bob_private_fn", "pr-1", false, 2e-3, 2.1e-3, 2.2e-3)
	bobShared := record(t, f.bobTracker, "bob_shared_fn", "pr-1", true, 3e-3, 3.1e-3, 3.2e-3)

	anon := browser(t)
	// Every page, and its JSON form, wants a login.
	for _, p := range []string{"/fleet", "/jobs", "/tuning", "/results", "/results/" + aliceOwn.ID, "/compare"} {
		code, _, h := get(t, anon, f.url+p)
		check.Equal(t, code, http.StatusSeeOther, p)
		check.True(t, strings.HasPrefix(h.Get("Location"), "/login?next="), p, h.Get("Location"))
		code, body, _ := get(t, anon, f.url+"/api"+p)
		check.Equal(t, code, http.StatusUnauthorized, p)
		check.True(t, strings.Contains(body, "log in"), body)
	}
	// A wrong token is refused, and sets no session.
	resp := login(t, anon, f.url, "kiln-user-not-a-real-token")
	check.Equal(t, resp.StatusCode, http.StatusUnauthorized)
	code, _, _ := get(t, anon, f.url+"/fleet")
	check.Equal(t, code, http.StatusSeeOther)

	// A login posted from another site's page is refused.
	req, err := http.NewRequest("POST", f.url+"/login", strings.NewReader(url.Values{"token": {f.alice}}.Encode()))
	check.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	resp, err = anon.Do(req)
	check.NoError(t, err)
	resp.Body.Close()
	check.Equal(t, resp.StatusCode, http.StatusForbidden)

	alice := browser(t)
	resp = login(t, alice, f.url, f.alice)
	check.Equal(t, resp.StatusCode, http.StatusSeeOther)
	check.Equal(t, resp.Header.Get("Location"), "/results")
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		cookie = c
	}
	check.True(t, cookie != nil && cookie.HttpOnly && cookie.SameSite == http.SameSiteStrictMode, cookie)

	code, body, h := get(t, alice, f.url+"/results")
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'"), h)
	check.True(t, strings.Contains(body, "alice_private_fn"), "alice sees her own result")
	check.True(t, strings.Contains(body, "bob_shared_fn"), "alice sees bob's shared result")
	check.True(t, !strings.Contains(body, "bob_private_fn") && !strings.Contains(body, bobOwn.ID), "alice must not see bob's private result")
	check.True(t, strings.Contains(body, `data-chart="`), "the results page has a chart")
	// Nor by its id, on the page or its JSON form, nor in a comparison.
	code, body, _ = get(t, alice, f.url+"/results/"+bobOwn.ID)
	check.Equal(t, code, http.StatusNotFound)
	check.True(t, !strings.Contains(body, "bob_private_fn"), body)
	code, _, _ = get(t, alice, f.url+"/api/results/"+bobOwn.ID)
	check.Equal(t, code, http.StatusNotFound)
	code, body, _ = get(t, alice, f.url+"/compare?a="+bobOwn.ID+"&b="+aliceOwn.ID)
	check.Equal(t, code, http.StatusNotFound)
	check.True(t, !strings.Contains(body, "bob_private_fn"), body)
	code, body, _ = get(t, alice, f.url+"/compare?a=pr-1&b=pr-1")
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, "bob_shared_fn") && !strings.Contains(body, "bob_private_fn"), body)
	code, body, _ = get(t, alice, f.url+"/results/"+bobShared.ID)
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, "bob_shared_fn") && strings.Contains(body, "bob_shared_fn_kernel1"), body)

	// The tuning page shows the tuning trials only (source "tune").
	_, err = f.aliceTracker.RecordResult(context.Background(), proto.Result{
		Function: "dense_tuned", Label: "tune-x", Source: proto.ResultSourceTune, Time: proto.TimeResult{Results: []float64{1e-3}, Median: 1e-3},
	})
	check.NoError(t, err)
	code, body, _ = get(t, alice, f.url+"/tuning")
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, "dense_tuned") && strings.Contains(body, `data-label="tune-x"`), body)
	check.True(t, !strings.Contains(body, "alice_private_fn"), "a bench result is no tuning trial")

	// The JSON form carries the same content.
	code, body, _ = get(t, alice, f.url+"/api/fleet")
	check.Equal(t, code, http.StatusOK)
	var rep struct{ Title, HTML string }
	check.NoError(t, json.Unmarshal([]byte(body), &rep))
	check.True(t, strings.Contains(rep.HTML, "board-7"), rep.HTML)

	// Log out wants the page's check token; without it, nothing ends.
	resp, err = alice.PostForm(f.url+"/logout", url.Values{})
	check.NoError(t, err)
	resp.Body.Close()
	check.Equal(t, resp.StatusCode, http.StatusForbidden)
	code, _, _ = get(t, alice, f.url+"/fleet")
	check.Equal(t, code, http.StatusOK)

	// The administrator (the fleet token) sees bob's private result.
	admin := browser(t)
	login(t, admin, f.url, f.fleetToken)
	code, body, _ = get(t, admin, f.url+"/results/"+bobOwn.ID)
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, "bob_private_fn"), body)
	code, body, _ = get(t, admin, f.url+"/static/chart.js")
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, "KilnChart"), "the chart script is embedded")
}

// A session ends when the tracker no longer admits its token: bob's user
// is revoked and his next page asks him to log in again.
func TestConsoleSessionEndsWithRevokedToken(t *testing.T) {
	f := startFleet(t, time.Second)
	bob := browser(t)
	check.Equal(t, login(t, bob, f.url, f.bob).StatusCode, http.StatusSeeOther)
	code, _, _ := get(t, bob, f.url+"/fleet")
	check.Equal(t, code, http.StatusOK)
	// Revoking the users file's line closes bob's tracker connections.
	check.NoError(t, revokeUser(f, "bob"))
	deadline := time.Now().Add(time.Minute)
	for {
		code, _, _ = get(t, bob, f.url+"/fleet")
		if code == http.StatusSeeOther {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's session still served pages a minute after his token was revoked (status %d)", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	check.Equal(t, login(t, bob, f.url, f.bob).StatusCode, http.StatusUnauthorized)
	_, err := f.bobTracker.ListResults(context.Background(), proto.ResultListArgs{})
	check.True(t, err != nil, "the revoked token no longer lists results")
}
