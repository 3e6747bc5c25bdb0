package transform

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Attributes that make_packed_api sets on the functions it produces.
const (
	// AttrCallingConv is set to CallingConvPacked on packed functions.
	AttrCallingConv = "calling_conv"
	// AttrSignature holds the JSON of the function's abi.FuncInfo: the
	// signature the caller sees, for the module's metadata.
	AttrSignature = "kiln.signature"
	// AttrDeviceType (int64, a DLPack device type) is the device whose
	// tensors a function accepts; 1 (cpu) when absent.
	AttrDeviceType = "kiln.device_type"
)

// CallingConvPacked is the value of AttrCallingConv on a function with the
// kernel ABI's packed signature.
const CallingConvPacked = "kiln_packed"

// The helpers packed functions call (as call_extern). Code generators
// define them in the generated source; each mirrors a field access of
// KilnValue or DLTensor in abi/kiln_abi.h.
const (
	HelperArgType      = "kiln_arg_type"           // (codes, i) int32
	HelperArgInt       = "kiln_arg_int"            // (args, i) int64
	HelperArgFloat     = "kiln_arg_float"          // (args, i) float64
	HelperArgHandle    = "kiln_arg_handle"         // (args, i) handle
	HelperIsNull       = "kiln_is_null"            // (h) bool
	HelperNDim         = "kiln_tensor_ndim"        // (t) int32
	HelperShape        = "kiln_tensor_shape"       // (t, j) int64
	HelperStride       = "kiln_tensor_stride"      // (t, j) int64, compact when strides is NULL
	HelperCompact      = "kiln_tensor_is_compact"  // (t) bool
	HelperDTypeCode    = "kiln_tensor_dtype_code"  // (t) int32
	HelperDTypeBits    = "kiln_tensor_dtype_bits"  // (t) int32
	HelperDTypeLanes   = "kiln_tensor_dtype_lanes" // (t) int32
	HelperDeviceType   = "kiln_tensor_device_type" // (t) int32
	HelperData         = "kiln_tensor_data"        // (t) handle: data + byte_offset
	HelperRetInt       = "kiln_ret_int"            // (ret_value, ret_tcode, int64): store an integer result
	HelperRetFloat     = "kiln_ret_float"          // (ret_value, ret_tcode, float64): store a float result
	deviceCPU          = 1
	packedArgsName     = "args"
	packedTypeCodesArg = "arg_type_ids"
)

// Signature returns the caller's view of f (its exported name, and each
// parameter's kind, dtype and shape) as the module metadata lists it.
// Symbolic dimensions are named by their variables (renamed n_1… when two
// distinct variables share a name); a parameter with a dimension that is
// neither a constant nor a variable gets no shape (any shape is accepted
// by the loader; the generated checks still apply). The tensors f writes
// (WrittenParams) are marked as outputs.
func Signature(f *ir.PrimFunc) abi.FuncInfo {
	fi := abi.FuncInfo{Name: FuncName(f), Params: []abi.ParamInfo{}}
	if !ir.IsVoid(f.RetType) {
		fi.Ret = f.RetType.String()
	}
	written := map[string]bool{}
	for _, n := range WrittenParams(f) {
		written[n] = true
	}
	names := map[*ir.Var]string{}
	used := map[string]bool{}
	dimName := func(v *ir.Var) string {
		if n, ok := names[v]; ok {
			return n
		}
		n := v.Name
		for i := 1; used[n]; i++ {
			n = v.Name + "_" + strconv.Itoa(i)
		}
		used[n] = true
		names[v] = n
		return n
	}
	for _, p := range f.Params {
		b := f.BufferMap[p]
		if b == nil {
			kind := abi.ParamInt
			switch {
			case p.Type.IsFloat():
				kind = abi.ParamFloat
			case ir.IsHandle(p.Type):
				kind = abi.ParamHandle
			}
			fi.Params = append(fi.Params, abi.ParamInfo{Name: p.Name, Kind: kind})
			continue
		}
		pi := abi.ParamInfo{Name: b.Name, Kind: abi.ParamTensor, DType: b.DType.String(), Shape: []abi.Dim{}, Output: written[b.Name]}
		for _, s := range b.Shape {
			switch s := s.(type) {
			case *ir.IntImm:
				pi.Shape = append(pi.Shape, abi.Dim{Value: s.Value})
			case *ir.Var:
				pi.Shape = append(pi.Shape, abi.Dim{Name: dimName(s)})
			default:
				pi.Shape = nil
			}
			if pi.Shape == nil {
				break
			}
		}
		fi.Params = append(fi.Params, pi)
	}
	return fi
}

// MakePackedAPI gives f the kernel ABI's packed signature
// (args, arg_type_ids, num_args) and a prologue that checks the call
// before running the body: the argument count, each argument's type code,
// and for tensors a non-NULL pointer, the number of dimensions, the dtype,
// the device type, static dimensions, compact strides (or binds the
// buffer's stride variables), and symbolic dimensions, bound from their
// first occurrence and checked against later ones. Failed checks return
// an error whose message names the function, the argument and what was
// expected. The caller's view of the signature is stored in
// AttrSignature.
//
// A function with a result (RetType, set by `-> T.int64`) gets TVM's two
// further parameters, ret_value and ret_tcode: each `return value` stores
// the value (as int64 or float64) and its type code there and returns 0.
func MakePackedAPI(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	if f.Attrs[AttrCallingConv] == CallingConvPacked {
		return nil, fmt.Errorf("function already has the packed API")
	}
	name := FuncName(f)
	sig := Signature(f)
	sigJSON, err := json.Marshal(sig)
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	devType := int64(deviceCPU)
	if d, ok := f.Attrs[AttrDeviceType].(int64); ok {
		devType = d
	}

	args := ir.NewVar(packedArgsName, ir.Handle)
	codes := ir.NewVar(packedTypeCodesArg, ir.Handle)
	numArgs := ir.NewVar("num_args", ir.Int32)

	b := &prologue{}
	b.assert(ir.EQ(numArgs, ir.I32(int64(len(f.Params)))),
		fmt.Sprintf("%s: wrong number of arguments: want %d", name, len(f.Params)))

	bound := map[*ir.Var]string{} // variable → where it was bound
	var deferred []ir.Stmt
	i32 := func(v int) ir.Expr { return ir.I32(int64(v)) }
	for i, p := range f.Params {
		buf := f.BufferMap[p]
		code := ir.NewCallExtern(ir.Int32, HelperArgType, codes, i32(i))
		if buf == nil {
			argName := fmt.Sprintf("%s: argument %q (#%d)", name, p.Name, i)
			switch {
			case p.Type.IsFloat():
				b.assert(ir.EQ(code, ir.I32(int64(abi.CodeFloat))), argName+": want a float")
				b.let(p, ir.NewCast(p.Type, ir.NewCallExtern(ir.Float64, HelperArgFloat, args, i32(i))))
			case ir.IsHandle(p.Type):
				b.assert(ir.Or(ir.EQ(code, ir.I32(int64(abi.CodeHandle))), ir.EQ(code, ir.I32(int64(abi.CodeNull)))), argName+": want a handle")
				b.let(p, ir.NewCallExtern(ir.Handle, HelperArgHandle, args, i32(i)))
			default:
				b.assert(ir.Or(ir.EQ(code, ir.I32(int64(abi.CodeInt))), ir.EQ(code, ir.I32(int64(abi.CodeUInt)))), argName+": want an integer")
				b.let(p, ir.NewCast(p.Type, ir.NewCallExtern(ir.Int64, HelperArgInt, args, i32(i))))
			}
			bound[p] = fmt.Sprintf("argument %q", p.Name)
			continue
		}
		argName := fmt.Sprintf("%s: argument %q (#%d)", name, buf.Name, i)
		b.assert(ir.EQ(code, ir.I32(int64(abi.CodeDLTensor))), argName+": want a tensor")
		h := ir.NewVar(buf.Name+"_handle", ir.Handle)
		b.let(h, ir.NewCallExtern(ir.Handle, HelperArgHandle, args, i32(i)))
		b.assert(ir.LogicalNot(ir.NewCallExtern(ir.Bool, HelperIsNull, h)), argName+": tensor is NULL")
		nd := len(buf.Shape)
		b.assert(ir.EQ(ir.NewCallExtern(ir.Int32, HelperNDim, h), i32(nd)),
			fmt.Sprintf("%s: want %d dimension%s", argName, nd, plural(nd)))
		dt := buf.DType
		b.assert(ir.And(ir.And(
			ir.EQ(ir.NewCallExtern(ir.Int32, HelperDTypeCode, h), i32(int(dt.Code))),
			ir.EQ(ir.NewCallExtern(ir.Int32, HelperDTypeBits, h), i32(int(dt.Bits)))),
			ir.EQ(ir.NewCallExtern(ir.Int32, HelperDTypeLanes, h), i32(int(dt.Lanes)))),
			fmt.Sprintf("%s: want dtype %s", argName, dt))
		b.assert(ir.EQ(ir.NewCallExtern(ir.Int32, HelperDeviceType, h), i32(int(devType))),
			fmt.Sprintf("%s: want a tensor on %s", argName, deviceName(devType)))
		where := func(what string, j int) string {
			return fmt.Sprintf("argument %q %s %d", buf.Name, what, j)
		}
		bindDims := func(exprs []ir.Expr, helper, what string) {
			for j, e := range exprs {
				got := ir.NewCallExtern(ir.Int64, helper, h, i32(j))
				switch e := e.(type) {
				case *ir.IntImm:
					b.assert(ir.EQ(got, ir.I64(e.Value)), fmt.Sprintf("%s: %s %d must be %d", argName, what, j, e.Value))
				case *ir.Var:
					if from, ok := bound[e]; ok {
						b.assert(ir.EQ(got, ir.NewCast(ir.Int64, e)),
							fmt.Sprintf("%s: %s %d must equal %s (from %s)", argName, what, j, e.Name, from))
						continue
					}
					b.let(e, ir.NewCast(e.Type, got))
					bound[e] = where(what, j)
				default:
					deferred = append(deferred, &ir.AssertStmt{Cond: ir.EQ(got, ir.NewCast(ir.Int64, e)),
						Message: fmt.Sprintf("%s: %s %d must equal %s", argName, what, j, e)})
				}
			}
		}
		bindDims(buf.Shape, HelperShape, "dimension")
		if len(buf.Strides) == 0 {
			b.assert(ir.NewCallExtern(ir.Bool, HelperCompact, h), argName+": want compact (row-major) strides")
		} else {
			bindDims(buf.Strides, HelperStride, "stride")
		}
		if v, ok := buf.ElemOffset.(*ir.Var); ok {
			if _, done := bound[v]; !done {
				b.let(v, ir.NewIntImm(v.Type, 0))
				bound[v] = "the element offset of argument " + strconv.Quote(buf.Name)
			}
		}
		b.let(buf.Data, ir.NewCallExtern(ir.Handle, HelperData, h))
	}
	for _, d := range deferred {
		b.items = append(b.items, prologueItem{stmt: d})
	}
	params := []*ir.Var{args, codes, numArgs}
	userBody := f.Body
	if !ir.IsVoid(f.RetType) {
		retValue := ir.NewVar("ret_value", ir.Handle)
		retCode := ir.NewVar("ret_tcode", ir.Handle)
		params = append(params, retValue, retCode)
		userBody = rewriteReturns(userBody, f.RetType, retValue, retCode)
	}
	body := b.wrap(userBody)
	attrs := maps.Clone(f.Attrs)
	if attrs == nil {
		attrs = map[string]any{}
	}
	attrs[AttrCallingConv] = CallingConvPacked
	attrs[AttrSignature] = string(sigJSON)
	delete(attrs, AttrOutputs) // now in the signature
	attrs[ir.AttrGlobalSymbol] = name
	return &ir.PrimFunc{
		Params:    params,
		BufferMap: map[*ir.Var]*ir.Buffer{},
		Body:      body,
		RetType:   ir.Int32,
		Attrs:     attrs,
	}, nil
}

// rewriteReturns turns each `return value` of a function returning t into
// the store of value into the caller's ret_value and ret_tcode, then a
// return of status 0 (TVM's ReturnRewriter).
func rewriteReturns(body ir.Stmt, t ir.DType, retValue, retCode *ir.Var) ir.Stmt {
	return ir.Transform(body, nil, func(s ir.Stmt) ir.Stmt {
		v := ir.RetValue(s)
		if v == nil {
			return s
		}
		helper, wide := HelperRetInt, ir.Int64
		if t.IsFloat() {
			helper, wide = HelperRetFloat, ir.Float64
		}
		store := &ir.Evaluate{Value: ir.NewCallExtern(ir.Void, helper, retValue, retCode, ir.NewCast(wide, v))}
		return ir.Seq(store, ir.Ret(ir.I32(0)))
	})
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func deviceName(t int64) string {
	switch t {
	case 1:
		return "cpu"
	case 2:
		return "cuda"
	}
	return fmt.Sprintf("device type %d", t)
}

// prologue collects checks and bindings in order.
type prologue struct {
	items []prologueItem
}

type prologueItem struct {
	stmt  ir.Stmt // an assert, or nil for a binding
	v     *ir.Var
	value ir.Expr
}

func (b *prologue) assert(cond ir.Expr, msg string) {
	b.items = append(b.items, prologueItem{stmt: &ir.AssertStmt{Cond: cond, Message: msg}})
}

func (b *prologue) let(v *ir.Var, value ir.Expr) {
	b.items = append(b.items, prologueItem{v: v, value: value})
}

// wrap nests body under the prologue: asserts in sequence, bindings as
// LetStmts around what follows them.
func (b *prologue) wrap(body ir.Stmt) ir.Stmt {
	for i := len(b.items) - 1; i >= 0; i-- {
		it := b.items[i]
		if it.stmt != nil {
			body = ir.Seq(it.stmt, body)
		} else {
			body = &ir.LetStmt{Var: it.v, Value: it.value, Body: body}
		}
	}
	return body
}
