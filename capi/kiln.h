/*
 * kiln.h — the C API of kiln (libkiln.so).
 *
 * One implementation for every language: this library is kiln's Go SDK and
 * compiler built with `go build -buildmode=c-shared -o libkiln.so ./capi`.
 * Bindings (the Python package `kiln` among them) call these functions; the
 * wire protocol is never written a second time.
 *
 * Conventions
 *   - Every object (tracker, session, module, function, array, tuple, cancel
 *     token) is an opaque KilnHandle, never 0, freed explicitly with
 *     kiln_free. kiln_live_handles counts the handles not yet freed, and
 *     the DLPack tensors exported and not yet deleted.
 *   - Functions returning int return 0 on success and -1 on failure; then
 *     kiln_last_error() is the calling thread's message and
 *     kiln_last_error_kind() its class (KILN_ERR_*). Both stay until the
 *     thread's next failing call.
 *   - Strings returned through char** are malloc'd; free them with
 *     kiln_string_free.
 *   - Blocking functions take a cancel token (0 for none): kiln_cancel on it,
 *     from any thread, makes them return KILN_ERR_CANCELLED.
 *   - Tensors cross the boundary as DLPack (DLTensor, DLManagedTensor).
 *   - Every function is safe to call from any thread.
 */
#ifndef KILN_H_
#define KILN_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DLPACK_VERSION
/* DLPack's structs, laid out as in dlpack.h (v0.8). */
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
} DLDeviceType;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
#endif

/* An opaque object; 0 is "none". */
typedef uint64_t KilnHandle;

/* Error classes (kiln_last_error_kind). */
enum {
  KILN_ERR_NONE = 0,
  KILN_ERR_ARGUMENT = 1,  /* bad argument: shape, dtype, freed handle, ... */
  KILN_ERR_TRACKER = 2,   /* tracker: unreachable, refused, no such key */
  KILN_ERR_SESSION = 3,   /* device session: unreachable, closed, call failed */
  KILN_ERR_BUILD = 4,     /* compiling a module */
  KILN_ERR_CANCELLED = 5, /* kiln_cancel was called on the token */
  KILN_ERR_INTERNAL = 6,
};

/* Causes of errors (kiln_last_error_code), for bindings whose languages
 * raise them as their own exceptions. */
enum {
  KILN_CODE_NONE = 0,
  KILN_CODE_NOT_FOUND = 1,       /* no such function, file or module */
  KILN_CODE_SESSION_EXPIRED = 2, /* the session passed its timeout */
  KILN_CODE_DEADLINE = 3,        /* a call passed its deadline */
  KILN_CODE_CRASHED = 4,         /* the session's worker died */
};

/* Value type codes of call arguments and results. */
enum {
  KILN_INT = 0,
  KILN_FLOAT = 2,
  KILN_NULL = 4,
  KILN_ARRAY = 7, /* v_handle: an array handle */
  KILN_STR = 11,  /* v_str: a NUL-terminated string (results: malloc'd) */
  KILN_BYTES = 12, /* v_handle: a KilnSpan* of bytes; results: a blob handle */
  KILN_TUPLE = 20, /* v_handle: a tuple handle (results only) */
  KILN_FUNC = 21,  /* v_handle: a function handle (results only) */
  KILN_SHAPE = 22, /* v_handle: a KilnSpan* of int64 dimensions; results: a blob handle */
};

typedef union {
  int64_t v_int64;
  double v_float64;
  KilnHandle v_handle;
  const char* v_str;
} KilnArg;

/* Bytes or a shape passed as an argument (KILN_BYTES, KILN_SHAPE): len
 * is in bytes, or in dimensions of int64. */
typedef struct {
  const void* data;
  int64_t len;
} KilnSpan;

/* Called with each progress line of a waiting request or a build. */
typedef void (*KilnProgressFn)(const char* line, void* user);

/* The prototypes below are left out where libkiln's own Go code includes
 * this header (it defines KILN_NO_PROTOTYPES): cgo declares the exported
 * functions itself, without const. */
#ifndef KILN_NO_PROTOTYPES

/* Errors and handles. */
const char* kiln_last_error(void);
int kiln_last_error_kind(void);
/* What the thread's last error says beyond its class (KILN_CODE_*). */
int kiln_last_error_code(void);
int64_t kiln_live_handles(void);
int kiln_free(KilnHandle h);
void kiln_string_free(char* s);
/* The library's version string (static; do not free). */
const char* kiln_version(void);

/* Cancel tokens. */
int kiln_cancel_new(KilnHandle* out);
int kiln_cancel(KilnHandle token);

/* Tracker. addr is "HOST:PORT", or the replicas of a tracker cluster
   separated by commas ("HOST:PORT,HOST:PORT"); token may be NULL or "". */
int kiln_tracker_connect(const char* addr, const char* token, KilnHandle cancel, KilnHandle* out);
/* The tracker's summary (keys, devices, compilers, queues, jobs) as JSON. */
int kiln_tracker_summary(KilnHandle tracker, char** out_json);
/* Leases a device by key (and/or selector) and opens a session on it. The
 * session holds the lease; kiln_free on the session releases it. wait_s > 0
 * bounds the wait in the queue; with wait_s == 0 a key no device is
 * registered under fails at once. */
int kiln_tracker_request(KilnHandle tracker, const char* key, const char* selector, int32_t priority,
                         double session_timeout_s, double wait_s, KilnProgressFn progress, void* user,
                         KilnHandle cancel, KilnHandle* out_session);

/* Sessions. */
int kiln_connect(const char* addr, const char* token, KilnHandle cancel, KilnHandle* out_session);
/* kiln_connect with a session timeout in seconds (0: the daemon's limit):
 * the daemon ends the session, freeing the device, once it has passed. */
int kiln_connect_timeout(const char* addr, const char* token, double timeout_s, KilnHandle cancel,
                         KilnHandle* out_session);
/* A session on this machine's CPU with the same API as a remote one. */
int kiln_local(KilnHandle* out_session);
/* JSON: {"kind": "remote"|"local", "addr", "key", "id", "expires", ...}. */
int kiln_session_info(KilnHandle session, char** out_json);
/* Copies the local file path into the session's directory as name. */
int kiln_session_upload(KilnHandle session, const char* path, const char* name, KilnHandle cancel);
/* Loads an uploaded file (a .kiln artifact); a local session also loads a
 * path on this machine. A local module stays loaded until its session is
 * freed (arrays and functions taken from it may outlive the handle). */
int kiln_session_load_module(KilnHandle session, const char* name, KilnHandle* out_module);
/* A global function of the session's registry (on a device daemon, e.g.
 * "rpcserver.nop", an empty function). */
int kiln_session_get_function(KilnHandle session, const char* name, KilnHandle* out_func);
/* JSON list of the module's function names. */
int kiln_module_functions(KilnHandle module, char** out_json);
int kiln_module_get_function(KilnHandle module, const char* name, KilnHandle* out_func);

/* The file API of a session (TVM's upload, download, listdir, remove):
 * files of the session's directory, whose sandbox refuses names that
 * leave it. download's buffer is malloc'd (kiln_string_free); listdir's
 * JSON is a list of {"name", "size"}. */
int kiln_session_upload_bytes(KilnHandle session, const void* data, int64_t size, const char* name, KilnHandle cancel);
int kiln_session_download(KilnHandle session, const char* name, KilnHandle cancel, void** out_data, int64_t* out_size);
int kiln_session_listdir(KilnHandle session, KilnHandle cancel, char** out_json);
int kiln_session_remove(KilnHandle session, const char* name, KilnHandle cancel);
/* Writes the artifact at src as dst (TVM's export_library): FILE.so the
 * linked host library, FILE.tar the tar export (the library and the
 * artifact, what load_module and download_linked_module take), else a copy. */
int kiln_artifact_export(const char* src, const char* dst);
/* The linked library of a tar export held in memory (malloc'd). */
int kiln_tar_linked(const void* data, int64_t size, void** out_data, int64_t* out_size);
/* Fork support: new handles start above floor; the last handle issued. */
int kiln_handle_floor(uint64_t floor);
uint64_t kiln_handle_next(void);

/* Arrays. */
int kiln_array_empty(KilnHandle session, int32_t ndim, const int64_t* shape, DLDataType dtype, DLDevice device,
                     KilnHandle* out_array);
/* The array's shape (up to max_ndim entries), ndim, dtype and device; for a
 * local array *data is its element zero (NULL for a remote one). */
int kiln_array_info(KilnHandle array, int32_t max_ndim, int64_t* shape, int32_t* ndim, DLDataType* dtype,
                    DLDevice* device, void** data);
/* Copies host memory (a compact CPU DLTensor of the same shape and dtype)
 * into the array, and the array into one. */
int kiln_array_copy_from(KilnHandle array, const DLTensor* src, KilnHandle cancel);
int kiln_array_copy_to(KilnHandle array, DLTensor* dst, KilnHandle cancel);
/* Wraps a DLPack tensor (CPU memory) as a local array without copying. The
 * array owns t from the call on, also when the call fails: its deleter is
 * called when the array is freed. */
int kiln_array_from_dlpack(DLManagedTensor* t, KilnHandle* out_array);
/* Exports a local array as a DLPack tensor sharing its memory; the array's
 * memory lives until the tensor's deleter is called. */
int kiln_array_to_dlpack(KilnHandle array, DLManagedTensor** out);

/* Calls. A result handle (array, tuple, function) is new; free it. */
int kiln_call(KilnHandle func, const KilnArg* args, const int32_t* codes, int32_t nargs, KilnHandle cancel,
              KilnArg* ret, int32_t* ret_code);
int kiln_tuple_size(KilnHandle tuple, int32_t* out);
/* A bytes or shape result's memory (len in bytes, or dimensions of int64),
 * valid until the handle is freed. */
int kiln_blob_get(KilnHandle blob, const void** data, int64_t* len);
int kiln_tuple_get(KilnHandle tuple, int32_t i, KilnArg* ret, int32_t* ret_code);
/* TVM's time_evaluator: one warm-up call, then repeat measurements of
 * number calls each (number grown until a measurement lasts min_repeat_ms).
 * The result is JSON: results, mean, median, min, max, std (seconds per
 * call), number, device, and report: the validity report (verdict
 * "stable" or "noisy", reason, n, cv, the median's 95% interval, the
 * device host's state; docs/timing.md). */
int kiln_time_evaluator(KilnHandle func, const KilnArg* args, const int32_t* codes, int32_t nargs, int32_t number,
                        int32_t repeat, int32_t min_repeat_ms, KilnHandle cancel, char** out_json);

/* kiln_time_evaluator with all of TVM's options as JSON: number, repeat,
 * min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms,
 * repeats_to_cooldown, cache_flush_bytes, f_preproc (a global function's
 * name, called with the arguments before each repeat). */
int kiln_time_evaluator_options(KilnHandle func, const KilnArg* args, const int32_t* codes, int32_t nargs,
                                const char* options_json, KilnHandle cancel, char** out_json);

/* Records a timing taken in a session leased from a tracker in that
 * tracker's results store, with the lease's device: args_json holds
 * function, time (the time evaluator's JSON), and optionally label,
 * shared, inputs ("A:float32[256]"), artifact (sha256), target, source.
 * out_json is the result as stored (id, owner, recorded). */
int kiln_session_record_result(KilnHandle session, const char* args_json, char** out_json);

/* Builds TVMScript source (name names it in messages) for target into the
 * artifact output, here (tracker == 0) or on a compiler node of the fleet,
 * and returns the artifact's path. progress (may be NULL) gets a line per
 * change of a remote build's state. */
int kiln_build(const char* source, const char* name, const char* target, KilnHandle tracker, const char* output,
               KilnProgressFn progress, void* user, KilnHandle cancel, char** out_path);

/* Builds the file at path: TVMScript, or an ONNX model (FILE.onnx) whose
 * weights are bundled into the artifact. input_shapes (may be NULL) fixes
 * the shapes of an ONNX model's inputs with symbolic dimensions, one
 * "NAME=D1xD2x..." a line. output NULL or "" means path with .kiln. */
int kiln_build_file(const char* path, const char* target, KilnHandle tracker, const char* output,
                    const char* input_shapes, KilnProgressFn progress, void* user, KilnHandle cancel,
                    char** out_path);

/* Tensor expressions and schedules. Text is TVMScript; the tensor
 * expression is the JSON graph the Python package's kiln.te writes (see
 * capi/te.go). Errors in either are KILN_ERR_ARGUMENT with a message that
 * names the stage, primitive, block or loop. */
/* The PrimFunc of a tensor-expression graph (TVM's te.create_prim_func), as
 * the text of a module of one function. */
int kiln_te_create_prim_func(const char* graph_json, char** out_script);
/* The PrimFunc name (the only one when NULL or "") of a module's text as a
 * module of that one function, its global symbol rename unless NULL or "". */
int kiln_tir_function(const char* script, const char* name, const char* rename, char** out_script);
/* A tir.Schedule of the PrimFunc name (the only one when NULL or "") of a
 * module's text, and a fork of one (blocks and loops stay valid in it). */
int kiln_schedule_new(const char* script, const char* name, KilnHandle* out_schedule);
int kiln_schedule_copy(KilnHandle schedule, KilnHandle* out_schedule);
/* Applies the primitive prim ("split", "get_loops", ...) to the JSON list
 * of its arguments: blocks and loops as {"block": N} / {"loop": N}, the
 * numbers earlier results gave, split's inferred factor as null. The
 * result is JSON: null, {"block"|"loop": N, "name": S}, or a list of them. */
int kiln_schedule_apply(KilnHandle schedule, const char* prim, const char* args_json, char** out_json);
/* The scheduled function as a module's text, and the trace (a JSON list of
 * the primitives applied, in TVM's Python syntax). */
int kiln_schedule_script(KilnHandle schedule, char** out_script);
int kiln_schedule_trace(KilnHandle schedule, char** out_json);

#endif /* KILN_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif

#endif /* KILN_H_ */
