// Package tune owns kiln's schedule search, the MetaSchedule way: a
// design space (Space: the rules of compiler/tune/rules applied to a
// PrimFunc, their sampling decisions recorded), candidates that are lists
// of decisions replayed on any machine, features of a candidate's loop
// nest, a learned cost model (gradient-boosted regression trees), an
// evolutionary search with epsilon-greedy exploration, and the tuning
// database (JSON lines of measured candidates).
//
// Measuring is not done here: the search hands batches of candidates to
// a Runner (a fleet of compiler nodes and devices, or the process itself
// in tests) and learns from what comes back.
//
// The package imports the compiler's IR, schedule and rules packages, the
// text format and the graph passes (to tell the functions run once per set
// of weights); it must not import the client, the daemons or the device
// backends.
package tune
