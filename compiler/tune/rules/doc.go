// Package rules owns the schedule rules of kiln's tuner: each rule turns a
// PrimFunc's schedule into a family of schedules, in the spirit of TVM's
// MetaSchedule (multi-level tiling, auto-inline, parallel-vectorize-unroll,
// random compute location). One file holds one rule; a rule registers
// itself for the target kinds it serves, so a new target adds rules
// without touching the search.
//
// A rule makes its choices only through the Sampler of its Context:
// SamplePerfectTile and SampleCategorical of compiler/schedule, which
// record each decision in the schedule's trace. The Sampler also keeps the
// decisions as data (Decision, keyed by a site name that says which rule,
// block and loop made it), so that a candidate is the list of its
// decisions, replayed on any machine by running the rules again with them.
//
// This package is pure IR code: it imports compiler/ir and
// compiler/schedule only and takes no context.
package rules
