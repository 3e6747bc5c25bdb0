// Declarations of support.c for the Go files.
#define KILN_NO_PROTOTYPES
#include "kiln.h"
void kiln_set_error(char* msg, int kind);
void kiln_set_error_code(int code);
DLManagedTensor* kiln_dlpack_new(int32_t ndim);
void kiln_dlpack_call_deleter(DLManagedTensor* t);
void kiln_progress_call(KilnProgressFn fn, const char* line, void* user);
void kiln_dlpack_set_ctx(DLManagedTensor* t, uint64_t ref);
