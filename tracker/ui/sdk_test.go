package ui_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The Go SDK's TimeAndRecord times a function on a leased device and
// records it, with the lease's device and the arrays' shapes, for the
// console and kiln results to show.
func TestSDKTimeAndRecord(t *testing.T) {
	f := startFleet(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := f.aliceTracker.RequestLease(ctx, client.LeaseRequest{Key: "cpu"})
	check.NoError(t, err)
	defer l.Release(ctx)
	s, err := client.Connect(ctx, l.Addr, client.SessionOptions{Token: f.fleetToken, LeaseToken: l.Token})
	check.NoError(t, err)
	defer s.Close()
	nop, err := s.GetGlobal(ctx, rpcserver.GlobalEcho)
	check.NoError(t, err)
	a, err := s.Empty(ctx, ndarray.Shape{4, 8}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	res, stored, err := s.TimeAndRecord(ctx, nop, client.TimeOptions{Number: 5, Repeat: 3}, client.Recording{Tracker: f.aliceTracker, Lease: l, Label: "sdk-run"}, a)
	check.NoError(t, err)
	check.Equal(t, len(res.Results), 3)
	check.True(t, stored.ID != "", stored)

	got, err := f.aliceTracker.GetResult(ctx, stored.ID)
	check.NoError(t, err)
	check.Equal(t, got.Owner, "alice")
	check.Equal(t, got.Source, proto.ResultSourceTimer)
	check.Equal(t, got.Function, nop.Name)
	check.Equal(t, got.DeviceKey, "cpu")
	check.Equal(t, got.NodeID, "board-7")
	check.Equal(t, strings.Join(got.Inputs, ","), "arg0:float32[4,8]")
	check.Equal(t, len(got.Time.Results), 3)
	check.True(t, got.DeviceAttrs.CPUCores > 0, got.DeviceAttrs)

	// Without a tracker nothing is timed.
	_, _, err = s.TimeAndRecord(ctx, nop, client.TimeOptions{Number: 1, Repeat: 1}, client.Recording{})
	check.Error(t, err, "no tracker")

	// The console shows it to alice, and not to bob.
	alice := browser(t)
	login(t, alice, f.url, f.alice)
	code, body, _ := get(t, alice, f.url+"/results?label=sdk-run")
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, stored.ID), "alice's SDK result is on her results page")
	bob := browser(t)
	login(t, bob, f.url, f.bob)
	code, body, _ = get(t, bob, f.url+"/results?label=sdk-run")
	check.Equal(t, code, http.StatusOK)
	check.True(t, !strings.Contains(body, stored.ID) && strings.Contains(body, "no-results"), body)
}
