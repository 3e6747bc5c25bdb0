// Package client is kiln's Go SDK: the device half talks to a device daemon
// (kiln rpcserver) in a Session — upload files, load modules, allocate and
// copy arrays, call and time functions — and the tracker half talks to a
// tracker (request a device, submit builds, query the fleet).
//
// A device session:
//
//	s, err := client.Connect(ctx, "10.0.0.7:9090", client.Options{Token: tok})
//	if err != nil { … }
//	defer s.Close()
//	err = s.UploadFile(ctx, "matmul.kiln", "out/matmul.kiln")
//	mod, err := s.LoadModule(ctx, "matmul.kiln")
//	f, err := mod.GetFunction(ctx, "matmul")
//	a, err := s.Empty(ctx, ndarray.Shape{128, 128}, ndarray.Float32, devices.CPUDevice)
//	…
//	res, err := s.TimeEvaluator(ctx, f, client.TimeOptions{Number: 10, Repeat: 3}, a, b, c)
//
// Errors keep their class across the wire: errors.Is(err, proto.ErrCrashed)
// holds when a kernel crashed the daemon's worker, proto.ErrSessionExpired
// when the session passed its deadline, proto.ErrBusy when the device is in
// another exclusive session.
//
// The tracker half takes one tracker address or several ("a:9190,b:9190",
// or a name that resolves to several: the replicas of one fleet).
// DialTracker's Tracker and a device daemon's or compiler node's Registrar
// fail over between them: when a connection drops, or a replica answers
// ErrUnavailable, they dial the next reachable replica with jittered
// backoff (up to TrackerOptions.FailoverTimeout per call), a Registrar
// registers again, and what was waiting resumes there: a lease request is
// queued again (its old ticket, and any lease granted to it but not
// delivered, ended with the old connection), WaitBuild waits on for the
// same job, leases go on renewing, SubmitBuild is sent again under the
// same idempotency key (one job, never two), uploads and downloads start
// over when their reader or file can. Sessions with device daemons never
// pass through the tracker and are untouched by its failure.
//
// client imports rpcserver/proto, ndarray and devices; it must not import
// the daemons' internals (rpcserver, tracker) nor cli.
package client
