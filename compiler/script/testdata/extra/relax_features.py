# Graph-level features beyond the seeds: symbolic shapes, match_cast,
# if/else, tuples, constants, packed calls, calls between functions.
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tir as T


@I.ir_module
class Module:
    I.module_attrs({"device": "cpu"})

    @T.prim_func(private=True)
    def scale(x: T.handle, y: T.handle):
        n = T.int64()
        X = T.match_buffer(x, (n, 4))
        Y = T.match_buffer(y, (n, 4))
        for i, j in T.grid(n, T.int64(4)):
            with T.block("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                Y[vi, vj] = X[vi, vj] * T.float32(2)

    @R.function(private=True)
    def helper(a: R.Tensor((2, 3), dtype="float32")) -> R.Tensor((2, 3), dtype="float32"):
        b = R.multiply(a, R.const(2.0, "float32"))
        return b

    @R.function
    def main(x: R.Tensor(("n", 4), dtype="float32"), flag: R.Tensor((), dtype="bool"), w: R.Tensor((2, 3), dtype="float32")):
        n = T.int64()
        cls = Module
        with R.dataflow():
            y = R.call_tir(cls.scale, (x,), out_sinfo=R.Tensor((n, 4), dtype="float32"))
            z = R.add(y, R.const([1.0, 2.0, 3.0, 4.0], "float32"))
            s = R.sum(z, axis=[1], keepdims=True)
            parts = R.split(w, indices_or_sections=[1], axis=0)
            first: R.Tensor((1, 3), dtype="float32") = parts[0]
            R.output(z, first)
        h = cls.helper(w)
        if flag:
            k = R.nn.relu(h)
            r = k
        else:
            r = R.negative(h)
        m = R.match_cast(z, R.Tensor((8, 4), dtype="float32"))
        shp: R.Shape([n, 4]) = R.shape_of(z)
        out = (r, m, first, shp, R.prim_value(n * 2))
        return out

    @R.function(pure=False)
    def stateful(x: R.Tensor((2, 2), dtype="int32")) -> R.Tuple:
        storage = R.memory.alloc_storage(R.shape([16]), 0, "global", "uint8")
        t = R.memory.alloc_tensor(storage, 0, R.shape([2, 2]), "int32")
        _ = R.memory.kill_tensor(t)
        R.memory.kill_storage(storage)
        c = R.const([[1, -2], [3, 4]], "int32")
        p = R.call_packed("vm.builtin.show", c, sinfo_args=(R.Object,))
        return R.tuple()
