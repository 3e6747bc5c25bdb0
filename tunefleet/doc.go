// Package tunefleet measures tuning candidates on a kiln fleet: it is the
// tuner's Runner over the client SDK. Each candidate is printed as a
// one-function module and submitted as a build job (the tracker spreads
// the jobs over every compiler node that builds the target); each built
// artifact is uploaded to one of the leased devices, run once on inputs
// drawn for its workload, checked against the reference result (the
// unscheduled function's, computed once on the fleet) and only then timed
// by the device-side time evaluator. A timing whose validity report says
// noisy is taken once more and the candidate ranked on both together; the
// verdict goes into the tuning database with the record.
//
// A candidate that fails to build, fails or crashes when it runs, or
// computes a wrong result is reported invalid with the stage and the
// reason; a crash costs the device its session, which is reopened (the
// device goes back to the pool for the next candidate). A device whose
// daemon is gone is dropped and its candidate measured on another.
//
// With Config.Dial the runner owns its tracker connection: when it fails
// for longer than the client SDK keeps failing over (the tracker
// restarted and stayed away), the runner redials with a bounded backoff,
// waits again for the build jobs in flight (the tracker keeps them over a
// restart; a job it lost is submitted again) and leases its devices
// again through the new connection before their next measurement.
//
// It imports the client SDK, rpcserver/timer (to pool timings) and
// compiler/tune; nothing in compiler imports it.
package tunefleet
