"""MetaSchedule's RPC runner from Apache TVM (python/tvm/s_tir/meta_schedule),
run on kiln by changing imports only.

runner/rpc_runner.py, runner/config.py, runner/utils.py and
testing/local_rpc.py are TVM's files, their license headers kept, with
only their ``tvm`` imports pointed at kiln.tvm_compat (and at _tvm for
the two TVM utilities below). The other modules are small pure-Python
counterparts of what those files import from TVM's C++ side:

- runner/runner.py: RunnerInput, RunnerResult, RunnerFuture, PyRunner and
  PyRunnerFuture (TVM registers them as FFI objects; here they are plain
  classes with the same fields and methods);
- arg_info.py: TensorInfo and its as_json form ["TENSOR", dtype, shape];
- utils.py: TVM's get_global_func_with_default_on_worker and
  get_global_func_on_rpc_session, over kiln.tvm_compat.get_global_func;
- logging.py, profiler.py: get_logger and Profiler.timeit;
- _tvm.py: derived_object (the identity: there is no FFI object to derive)
  and PopenPoolExecutor, on threads.

Why threads for PopenPoolExecutor: TVM runs each measurement in a popen
worker so that a crashing kernel cannot take the tuner down. On kiln the
kernel runs in the device daemon's sandboxed worker process, never in the
client, and every kiln call releases the GIL, so a thread per worker gives
the same isolation and concurrency without pickling the runner's
functions (TVM's tests pass closures, which TVM pickles with cloudpickle).
"""
