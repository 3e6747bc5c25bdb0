// The C half of libkiln: the thread-local last error, the DLPack deleter
// of exported arrays and the progress-callback trampoline. It lives in its
// own file because cgo copies the preamble of a file with //export into two
// C files, where a non-static definition would be defined twice.
#include <stdlib.h>
#define KILN_NO_PROTOTYPES
#include "kiln.h"
#include "_cgo_export.h"

static __thread char* kiln_err_msg;
static __thread int kiln_err_kind;
static __thread int kiln_err_code;

void kiln_set_error(char* msg, int kind) {
	free(kiln_err_msg);
	kiln_err_msg = msg;
	kiln_err_kind = kind;
	kiln_err_code = 0;
}

void kiln_set_error_code(int code) { kiln_err_code = code; }

int kiln_last_error_code(void) { return kiln_err_code; }

const char* kiln_last_error(void) { return kiln_err_msg ? kiln_err_msg : ""; }

int kiln_last_error_kind(void) { return kiln_err_kind; }

void kiln_string_free(char* s) { free(s); }

// kiln_dlpack_deleter frees a DLManagedTensor made by kiln_array_to_dlpack:
// manager_ctx holds the handle that keeps the array alive.
void kiln_dlpack_deleter(DLManagedTensor* t) {
	if (t == NULL) return;
	kilnReleaseExport((uint64_t)(uintptr_t)t->manager_ctx);
	free(t);
}

DLManagedTensor* kiln_dlpack_new(int32_t ndim) {
	DLManagedTensor* t = calloc(1, sizeof(DLManagedTensor) + sizeof(int64_t) * (size_t)ndim);
	if (t == NULL) return NULL;
	t->dl_tensor.ndim = ndim;
	t->dl_tensor.shape = (int64_t*)(t + 1);
	t->deleter = kiln_dlpack_deleter;
	return t;
}

void kiln_dlpack_call_deleter(DLManagedTensor* t) {
	if (t != NULL && t->deleter != NULL) t->deleter(t);
}

void kiln_progress_call(KilnProgressFn fn, const char* line, void* user) {
	if (fn != NULL) fn(line, user);
}

void kiln_dlpack_set_ctx(DLManagedTensor* t, uint64_t ref) { t->manager_ctx = (void*)(uintptr_t)ref; }
