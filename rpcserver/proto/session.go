package proto

// This file holds the device session's wire types: the methods a client
// calls on a device daemon (kiln rpcserver) once its hello has passed, their
// arguments and their results. The daemon serves the file methods itself and
// forwards the rest to the session's worker process, which owns the loaded
// modules, the functions and the arrays; handles name those objects and are
// only meaningful within one session.
//
// A session starts with SessionOpen (every other method, files included, is
// refused with ErrUnauthorized until it has succeeded) and ends with
// SessionClose or when the client closes its connection. Handles are uint64s, never 0.

import "time"

// Device session methods (Client.Call unless marked bulk).
const (
	// SessionOpen opens the session: OpenArgs → SessionInfo.
	SessionOpen = "session.open"

	// FileUpload (bulk upload) stores the body as the file Bulk.Name in the
	// session's directory, replacing any file of that name.
	FileUpload = "file.upload"
	// FileDownload (bulk download) sends the file Bulk.Name back.
	FileDownload = "file.download"
	// FileRemove removes a file: FileArgs → nil.
	FileRemove = "file.remove"
	// FileList lists the session's directory: nil → []FileInfo.
	FileList = "file.list"
	// FileStat describes one file: FileArgs → FileInfo.
	FileStat = "file.stat"
	// FileUploadTicket reserves an upload on a connection of its own:
	// UploadTicketArgs → UploadTicket. The client then dials the daemon
	// with RoleBulk, sends one frame holding BulkTicket and exactly Size
	// raw bytes, and reads one Response frame (ID 1) saying how it went.
	// Nothing multiplexes that connection, so a large file moves at the
	// speed of the socket (spliced into the file where the kernel can).
	FileUploadTicket = "file.upload_ticket"
	// FileLinkCached asks the daemon to place a file it already holds, by
	// content, in the session's directory: LinkCachedArgs → LinkCached.
	// Linked false (or ErrNotFound from a daemon without the method) means
	// the client uploads the file; an upload whose UploadTicketArgs claims
	// a SHA256 is checked against it and, when it matches, kept by content
	// for later sessions.
	FileLinkCached = "file.link_cached"

	// ModuleLoad loads a module from a file of the session's directory
	// (a .kiln artifact, or a bare shared object): ModuleLoadArgs → ModuleInfo.
	ModuleLoad = "module.load"
	// ModuleGetFunction looks a function up in a module: GetFunctionArgs → FuncInfo.
	ModuleGetFunction = "module.get_function"
	// GlobalGet looks a global function up in the worker's registry:
	// GetFunctionArgs (Module 0) → FuncInfo.
	GlobalGet = "global.get"
	// GlobalList lists the worker's global functions: nil → []string.
	GlobalList = "global.list"
	// FuncCall calls a function: CallArgs → Value.
	FuncCall = "func.call"
	// FuncTime runs the time evaluator on a function: TimeArgs → TimeResult.
	FuncTime = "func.time_evaluator"

	// ArrayEmpty allocates an array: EmptyArgs → ArrayInfo.
	ArrayEmpty = "array.empty"
	// ArrayCopyFrom (bulk upload) fills the array whose handle is
	// Bulk.Name (decimal) with exactly its byte size of compact row-major bytes.
	ArrayCopyFrom = "array.copy_from"
	// ArrayCopyTo (bulk download) sends the array whose handle is Bulk.Name
	// (decimal) as compact row-major bytes.
	ArrayCopyTo = "array.copy_to"

	// HandleFree releases a handle (module, function or array): HandleArgs → nil.
	// An array is freed once calls in flight that use it have returned.
	HandleFree = "handle.free"

	// DeviceAttrs describes the devices the daemon serves: nil → DeviceAttrsResult.
	DeviceAttrs = "device.attrs"

	// SessionStatus says why the session ended: nil → nil while it is
	// open, else the error that ended it (ErrCrashed naming the signal and
	// the function that was running, ErrSessionExpired, ErrDeadline). A
	// client asks when its call connection (RoleCall) breaks; the daemon
	// waits a moment for the worker's exit before it answers.
	SessionStatus = "session.status"

	// SessionClose ends the session: nil → nil once its slot is free, its
	// worker stopped and its directory removed, so that the client's next
	// session on an exclusive device is not refused as busy. The client
	// then closes the connection; a connection that ends without it ends
	// the session all the same.
	SessionClose = "session.close"

	// WorkerBulkSize is internal to the daemon: the size of what a bulk
	// download method of the worker will send (BulkSizeArgs → int64).
	WorkerBulkSize = "worker.bulk_size"
)

// OpenArgs opens a session.
type OpenArgs struct {
	// LeaseToken is the token of a tracker lease for this daemon; required
	// when the daemon verifies leases, ignored otherwise.
	LeaseToken string `msgpack:"lease_token,omitempty"`
	// Timeout, when positive, asks for a session shorter than the daemon
	// (or the lease) allows, never a longer one: the daemon ends it, and
	// frees the device, once it has passed (TVM's session_timeout on a
	// direct connection).
	Timeout time.Duration `msgpack:"timeout,omitempty"`
}

// SessionInfo describes an open session.
type SessionInfo struct {
	// ID names the session in the daemon's logs.
	ID string `msgpack:"id"`
	// Key is the daemon's device key ("" when it has none).
	Key string `msgpack:"key"`
	// ExpiresAt is when the daemon ends the session, in Unix nanoseconds.
	ExpiresAt int64 `msgpack:"expires_at"`
	// WorkerPID is the process id of the session's worker.
	WorkerPID int `msgpack:"worker_pid"`
	// Version is the daemon's kiln version.
	Version string `msgpack:"version"`
	// CallTicket, when set, lets the client carry the session's calls on
	// a connection of its own that the daemon hands to the worker: the
	// client dials with RoleCall, sends one frame holding CallTicket{Ticket},
	// reads one Response frame (ID 1), then sends plain request frames
	// served by the worker itself, one hop instead of two. Empty when the
	// daemon keeps itself on the path (TLS connections, whose encryption
	// state cannot leave its process); calls then go on the session's
	// connection. The ticket is good once, while the session lives.
	CallTicket string `msgpack:"call_ticket,omitempty"`
}

// CallTicket opens a RoleCall connection.
type CallTicket struct {
	Ticket string `msgpack:"ticket"`
}

// FileArgs names one file of the session's directory: a relative,
// slash-separated path that stays inside it.
type FileArgs struct {
	Name string `msgpack:"name"`
}

// FileInfo describes one file of the session's directory.
type FileInfo struct {
	Name string `msgpack:"name"`
	Size int64  `msgpack:"size"`
	// ModTime is the modification time in Unix nanoseconds.
	ModTime int64 `msgpack:"mod_time"`
}

// ModuleLoadArgs names the file to load.
type ModuleLoadArgs struct {
	Name string `msgpack:"name"`
	// MemoryCfg picks the VM's allocator for an artifact with a VM
	// executable: "pooled" (the default) or "naive".
	MemoryCfg string `msgpack:"memory_cfg,omitempty"`
}

// ModuleInfo describes a loaded module.
type ModuleInfo struct {
	Handle uint64 `msgpack:"handle"`
	// Type is the module kind ("cpu").
	Type string `msgpack:"type"`
	// Functions lists the functions the module defines.
	Functions []string `msgpack:"functions"`
}

// GetFunctionArgs looks a function up by name, in a module (Module is its
// handle) or in the global registry (Module 0).
type GetFunctionArgs struct {
	Module uint64 `msgpack:"module,omitempty"`
	Name   string `msgpack:"name"`
}

// FuncInfo is a function handle and the function's name.
type FuncInfo struct {
	Handle uint64 `msgpack:"handle"`
	Name   string `msgpack:"name"`
}

// Value kinds.
const (
	KindNil    = "nil"
	KindInt    = "int"
	KindFloat  = "float"
	KindString = "str"
	KindBytes  = "bytes"
	KindArray  = "array"  // Handle, and Array in results
	KindFunc   = "func"   // Handle, and Func in results
	KindModule = "module" // Handle, and Module in results
	KindDType  = "dtype"  // Str: "float32"
	KindDevice = "device" // Str: "cpu:0"
	KindShape  = "shape"  // Shape
	KindTuple  = "tuple"  // Fields, in results only
)

// Value is one argument or result of a remote call: a tagged union whose
// Kind says which field holds it.
type Value struct {
	Kind   string  `msgpack:"k"`
	Int    int64   `msgpack:"i,omitempty"`
	Float  float64 `msgpack:"f,omitempty"`
	Str    string  `msgpack:"s,omitempty"`
	Bytes  []byte  `msgpack:"b,omitempty"`
	Handle uint64  `msgpack:"h,omitempty"`
	Shape  []int64 `msgpack:"shape,omitempty"`
	// In results only: a new array, function or module the call returned,
	// registered under Handle.
	Array  *ArrayInfo  `msgpack:"array,omitempty"`
	Func   *FuncInfo   `msgpack:"func,omitempty"`
	Module *ModuleInfo `msgpack:"module,omitempty"`
	// Fields are a tuple result's values (a graph function's several
	// outputs), in order.
	Fields []Value `msgpack:"fields,omitempty"`
}

// UploadTicketArgs asks for a ticket to upload Size bytes as the file Name.
type UploadTicketArgs struct {
	Name string `msgpack:"name"`
	Size int64  `msgpack:"size"`
	// SHA256 (hex, optional) is the digest the client claims for the
	// bytes: the daemon refuses bytes that do not match it and keeps
	// those that do for FileLinkCached.
	SHA256 string `msgpack:"sha256,omitempty"`
}

// LinkCachedArgs names a file by content (hex SHA-256 and size) and the
// name it is wanted under in the session's directory.
type LinkCachedArgs struct {
	Name   string `msgpack:"name"`
	Size   int64  `msgpack:"size"`
	SHA256 string `msgpack:"sha256"`
}

// LinkCached answers FileLinkCached: Linked says the file is in place.
type LinkCached struct {
	Linked bool `msgpack:"linked"`
}

// UploadTicket is a one-time ticket for one upload; it expires unused.
type UploadTicket struct {
	Ticket string `msgpack:"ticket"`
}

// BulkTicket opens a RoleBulk connection.
type BulkTicket struct {
	Ticket string `msgpack:"ticket"`
}

// CallArgs calls the function Func with Args.
type CallArgs struct {
	Func uint64  `msgpack:"func"`
	Args []Value `msgpack:"args"`
}

// EmptyArgs allocates an uninitialized array.
type EmptyArgs struct {
	Shape []int64 `msgpack:"shape"`
	// DType is a dtype string ("float32").
	DType string `msgpack:"dtype"`
	// Device is a device string ("cpu:0"); "" means the CPU.
	Device string `msgpack:"device"`
}

// ArrayInfo describes a remote array.
type ArrayInfo struct {
	Handle uint64  `msgpack:"handle"`
	Shape  []int64 `msgpack:"shape"`
	DType  string  `msgpack:"dtype"`
	Device string  `msgpack:"device"`
	// Bytes is the size of its compact contents.
	Bytes int64 `msgpack:"bytes"`
}

// HandleArgs names one handle.
type HandleArgs struct {
	Handle uint64 `msgpack:"handle"`
}

// BulkSizeArgs asks the size of a bulk download.
type BulkSizeArgs struct {
	Method string `msgpack:"method"`
	Name   string `msgpack:"name"`
}

// TimeOptions are the time evaluator's parameters, with TVM's names and
// meanings (see DESIGN.md's timing contract). Zero values take defaults:
// Number 1, Repeat 1, RepeatsToCooldown 1; MinRepeatMS,
// LimitZeroTimeIterations (100 when 0), CooldownIntervalMS and
// CacheFlushBytes 0.
type TimeOptions struct {
	// Number is the calls per measurement at the start; it grows.
	Number int `msgpack:"number" json:"number"`
	// Repeat is the number of measurements (results).
	Repeat int `msgpack:"repeat" json:"repeat"`
	// MinRepeatMS is the shortest a measurement may last, in milliseconds.
	MinRepeatMS int `msgpack:"min_repeat_ms" json:"min_repeat_ms"`
	// LimitZeroTimeIterations bounds the measurements that read zero time.
	LimitZeroTimeIterations int `msgpack:"limit_zero_time_iterations" json:"limit_zero_time_iterations"`
	// CooldownIntervalMS is a pause between repeats, in milliseconds.
	CooldownIntervalMS int `msgpack:"cooldown_interval_ms" json:"cooldown_interval_ms"`
	// RepeatsToCooldown is how many repeats run between pauses.
	RepeatsToCooldown int `msgpack:"repeats_to_cooldown" json:"repeats_to_cooldown"`
	// CacheFlushBytes, when positive, is the size of a buffer copied before
	// each measurement to flush the caches.
	CacheFlushBytes int64 `msgpack:"cache_flush_bytes" json:"cache_flush_bytes"`
	// StableWithin is the largest half-width of the median's 95%
	// confidence interval, relative to the median, for which the validity
	// report says "stable" (0.02 for ±2% when 0). Daemons that predate
	// the report ignore it.
	StableWithin float64 `msgpack:"stable_within,omitempty" json:"stable_within,omitempty"`
	// Preproc, when set, names a global function of the session called
	// with the timed function's arguments before each repeat (TVM's
	// f_preproc, e.g. "cache_flush_cpu_non_first_arg"); its time is not
	// counted.
	Preproc string `msgpack:"f_preproc,omitempty" json:"f_preproc,omitempty"`
}

// TimeArgs times the function Func called with Args.
type TimeArgs struct {
	Func    uint64      `msgpack:"func"`
	Args    []Value     `msgpack:"args"`
	Options TimeOptions `msgpack:"options"`
}

// TimeResult is what the time evaluator measured. Times are seconds per
// call.
type TimeResult struct {
	// Results holds each repeat's mean seconds per call.
	Results []float64 `msgpack:"results" json:"results"`
	Mean    float64   `msgpack:"mean" json:"mean"`
	Median  float64   `msgpack:"median" json:"median"`
	Min     float64   `msgpack:"min" json:"min"`
	Max     float64   `msgpack:"max" json:"max"`
	// Std is the population standard deviation of Results.
	Std float64 `msgpack:"std" json:"std"`
	// Number is the calls per measurement used by the last repeat.
	Number int `msgpack:"number" json:"number"`
	// Device is the device the function ran on ("cpu:0").
	Device string `msgpack:"device,omitempty" json:"device,omitempty"`
	// ClockMHz and TempC are the device's clock and temperature at the end,
	// where the device reports them (0 otherwise).
	ClockMHz float64 `msgpack:"clock_mhz,omitempty" json:"clock_mhz,omitempty"`
	TempC    float64 `msgpack:"temp_c,omitempty" json:"temp_c,omitempty"`
	// Emulated names the emulator the device runs under ("qemu-aarch64"),
	// where its daemon says it runs under one: the times are then the
	// emulator's, not the board's, and mean nothing as performance.
	Emulated string `msgpack:"emulated,omitempty" json:"emulated,omitempty"`
	// Report says whether the figures can be trusted: their spread, the
	// machine's state while they were measured and a verdict. Daemons
	// that predate it send none (the client SDK then assesses Results
	// alone).
	Report *TimeReport `msgpack:"report,omitempty" json:"report,omitempty"`
}

// Verdicts of a TimeReport.
const (
	// VerdictStable: the median's 95% confidence interval is within
	// TimeReport.StableWithin of the median.
	VerdictStable = "stable"
	// VerdictNoisy: it is not, or there are too few results to say;
	// TimeReport.Reason says which and why.
	VerdictNoisy = "noisy"
)

// TimeReport is the validity report of a timing, computed on the device
// next to the results.
type TimeReport struct {
	// Verdict is VerdictStable or VerdictNoisy; Reason says why a timing
	// is noisy ("median's 95% CI ±4.1% > ±2%; load average 3.2 on 2 CPUs").
	Verdict string `msgpack:"verdict" json:"verdict"`
	Reason  string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// N is the number of results (samples) assessed.
	N int `msgpack:"n" json:"n"`
	// CV is the coefficient of variation of the results (std / mean).
	CV     float64 `msgpack:"cv" json:"cv"`
	Min    float64 `msgpack:"min" json:"min"`
	Median float64 `msgpack:"median" json:"median"`
	Max    float64 `msgpack:"max" json:"max"`
	// CILow and CIHigh bound the median's distribution-free 95%
	// confidence interval (order statistics; 0 when N is too small for
	// one), and CIHalf is its larger half relative to the median (0.041
	// for ±4.1%).
	CILow  float64 `msgpack:"ci_low" json:"ci_low"`
	CIHigh float64 `msgpack:"ci_high" json:"ci_high"`
	CIHalf float64 `msgpack:"ci_half" json:"ci_half"`
	// StableWithin is the threshold the verdict applied (0.02 for ±2%).
	StableWithin float64 `msgpack:"stable_within" json:"stable_within"`
	// Machine is the state of the device's host while the timing ran.
	Machine MachineState `msgpack:"machine" json:"machine"`
}

// MachineState is what a host said of itself around a timing: read before
// and after it, the worse of the two readings is kept (the higher load
// and temperatures, the range of frequencies, the most sessions).
type MachineState struct {
	// CPUs is the number of the host's CPUs (what the load compares to).
	CPUs int `msgpack:"cpus" json:"cpus"`
	// LoadAvg is the 1-minute load average.
	LoadAvg float64 `msgpack:"load_avg" json:"load_avg"`
	// FreqMinMHz and FreqMaxMHz are the lowest and highest current CPU
	// frequencies read (cpufreq's scaling_cur_freq), 0 where the board
	// does not expose them; Governors are the cpufreq governors in use.
	FreqMinMHz float64  `msgpack:"freq_min_mhz,omitempty" json:"freq_min_mhz,omitempty"`
	FreqMaxMHz float64  `msgpack:"freq_max_mhz,omitempty" json:"freq_max_mhz,omitempty"`
	Governors  []string `msgpack:"governors,omitempty" json:"governors,omitempty"`
	// TempsC are the readable thermal zones' temperatures in °C, by zone
	// type ("x86_pkg_temp", or "thermal_zone3" when the type is unknown).
	TempsC map[string]float64 `msgpack:"temps_c,omitempty" json:"temps_c,omitempty"`
	// OtherSessions is how many other sessions the device's daemon served
	// meanwhile.
	OtherSessions int `msgpack:"other_sessions" json:"other_sessions"`
	// Emulated names the emulator the timing ran under ("qemu-aarch64"),
	// "" when it ran on the hardware.
	Emulated string `msgpack:"emulated,omitempty" json:"emulated,omitempty"`
	// Unread names what could not be read ("cpufreq", "thermal zones",
	// "load average").
	Unread []string `msgpack:"unread,omitempty" json:"unread,omitempty"`
}

// DeviceAttrsResult describes the daemon's host and devices.
type DeviceAttrsResult struct {
	Host    HostInfo          `msgpack:"host" json:"host"`
	Devices []DeviceInfo      `msgpack:"devices" json:"devices"`
	Absent  map[string]string `msgpack:"absent" json:"absent"`
}

// HostInfo describes a daemon's host CPU.
type HostInfo struct {
	Model    string   `msgpack:"model" json:"model"`
	Arch     string   `msgpack:"arch" json:"arch"`
	Triple   string   `msgpack:"triple" json:"triple"`
	Cores    int      `msgpack:"cores" json:"cores"`
	Features []string `msgpack:"features" json:"features"`
}

// DeviceInfo is one device with the attributes its backend reports
// (snake_case names such as "name", "total_global_memory"; values are
// int64 or string).
type DeviceInfo struct {
	Device string         `msgpack:"device" json:"device"`
	Type   string         `msgpack:"type" json:"type"`
	Attrs  map[string]any `msgpack:"attrs" json:"attrs"`
}
