package proto

import "time"

// The tracker's results store keeps timings taken through the fleet, each
// owned by the user who recorded it:
//
//	tracker.results.record  ResultRecordArgs → Result (as stored: ID, Owner, Recorded set)
//	tracker.results.list    ResultListArgs   → ResultList (newest first)
//	tracker.results.get     ResultGetArgs    → Result
//
// A named user sees the results they recorded and those recorded with
// Shared; the fleet token (an administrator) sees every result. A result
// another user may not see is answered as ErrNotFound, as one that does
// not exist is.
const (
	MethodResultRecord = "tracker.results.record"
	MethodResultList   = "tracker.results.list"
	MethodResultGet    = "tracker.results.get"
)

// Sources of a Result.
const (
	ResultSourceBench   = "bench"          // kiln bench --tracker
	ResultSourceTimer   = "time_evaluator" // an SDK's time evaluator
	ResultSourceTune    = "tune"           // a tuning measurement
	ResultSourceProfile = "profile"        // a profile, per kernel
)

// Limits of a recorded Result: larger ones are refused with ErrTooLarge.
const (
	MaxResultSamples = 100000 // Time.Results, and each kernel's
	MaxResultKernels = 4096
	MaxResultLabel   = 128 // bytes of Label
	MaxResultInputs  = 256
)

// MaxKernelOps bounds the Ops of a recorded kernel: a recording client
// keeps the first MaxKernelOps, the tracker refuses more.
const MaxKernelOps = 256

// Result is one recorded timing: what was timed, where, by whom and the
// time evaluator's answer with its validity report.
type Result struct {
	// ID, Owner and Recorded are set by the tracker.
	ID       string    `msgpack:"id" json:"id"`
	Owner    string    `msgpack:"owner,omitempty" json:"owner,omitempty"`
	Recorded time.Time `msgpack:"recorded" json:"recorded"`
	// Shared makes the result visible to every user of the fleet.
	Shared bool `msgpack:"shared,omitempty" json:"shared,omitempty"`
	// Label groups results ("pr-123", "main"): kiln results compare
	// takes a label for the set of results that carry it.
	Label string `msgpack:"label,omitempty" json:"label,omitempty"`
	// Source is one of the ResultSource constants.
	Source string `msgpack:"source,omitempty" json:"source,omitempty"`
	// Artifact is the timed artifact's sha256 (lowercase hex).
	Artifact string `msgpack:"artifact,omitempty" json:"artifact,omitempty"`
	Function string `msgpack:"function" json:"function"`
	Target   string `msgpack:"target,omitempty" json:"target,omitempty"`
	// DeviceKey, NodeID and DeviceAttrs say which device ran it.
	DeviceKey   string    `msgpack:"device_key,omitempty" json:"device_key,omitempty"`
	NodeID      string    `msgpack:"node_id,omitempty" json:"node_id,omitempty"`
	DeviceAttrs NodeAttrs `msgpack:"device_attrs" json:"device_attrs"`
	// KilnVersion is the recording client's kiln version.
	KilnVersion string `msgpack:"kiln_version,omitempty" json:"kiln_version,omitempty"`
	// Inputs are the inputs' types and shapes, in parameter order
	// ("A:float32[256]").
	Inputs []string `msgpack:"inputs,omitempty" json:"inputs,omitempty"`
	// Time is the time evaluator's answer: every repeat, the statistics
	// and the validity report.
	Time TimeResult `msgpack:"time" json:"time"`
	// Kernels are per-kernel timings, where a profile provides them.
	Kernels []KernelTime `msgpack:"kernels,omitempty" json:"kernels,omitempty"`
}

// KernelTime is one kernel's timings within a Result, one figure a
// repeat: a time evaluator's seconds per call, or, in a profile (Source
// "profile"), its seconds within each inference, the one whose whole
// time is the same repeat of Time.Results.
type KernelTime struct {
	Name    string    `msgpack:"name" json:"name"`
	Results []float64 `msgpack:"results" json:"results"`
	// Calls is its calls in one inference, where a profile says.
	Calls int64 `msgpack:"calls,omitempty" json:"calls,omitempty"`
	// Ops are the model operators it computes ("/conv1/Conv (Conv)"),
	// where the compiler carried them.
	Ops []string `msgpack:"ops,omitempty" json:"ops,omitempty"`
}

// ResultRecordArgs records a result.
type ResultRecordArgs struct {
	Result Result `msgpack:"result"`
}

// ResultListArgs filters the results a list returns; empty fields do not
// filter.
type ResultListArgs struct {
	Function  string `msgpack:"function,omitempty"`
	DeviceKey string `msgpack:"device_key,omitempty"`
	// Attrs must all equal the device's flattened attributes
	// (NodeAttrs.Flatten: "cpu.avx2" = "true").
	Attrs map[string]string `msgpack:"attrs,omitempty"`
	Label string            `msgpack:"label,omitempty"`
	Owner string            `msgpack:"owner,omitempty"`
	// Source keeps one kind of result (a ResultSource constant).
	Source string `msgpack:"source,omitempty"`
	// Since keeps results recorded at or after it.
	Since time.Time `msgpack:"since,omitempty"`
	// Limit bounds the answer (0: the tracker's default, 1000); Total
	// says how many matched.
	Limit int `msgpack:"limit,omitempty"`
}

// ResultList is a list's answer, newest first.
type ResultList struct {
	Results []Result `msgpack:"results"`
	Total   int      `msgpack:"total"`
}

// ResultGetArgs names a result.
type ResultGetArgs struct {
	ID string `msgpack:"id"`
}
