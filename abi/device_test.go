package abi

import (
	"encoding/json"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

const goodDevice = `{"format_version":1,"kind":"cuda","arch":"sm_80","ptx":"device/kernels.ptx",
"cubins":{"sm_80":"device/sm_80.cubin"},
"kernels":[{"name":"add_kernel","func":"add","grid":[0,1,1],"block":[256,1,1],"shared_bytes":0,
"params":[{"name":"A","dtype":"float32","pointer":true},{"name":"n","dtype":"int32"}]}]}`

func TestParseDeviceMetadata(t *testing.T) {
	m, err := ParseDeviceMetadata([]byte(goodDevice))
	check.NoError(t, err)
	check.Equal(t, len(m.Kernels), 1)
	check.Equal(t, m.Kernels[0].Grid, [3]int64{0, 1, 1})
	check.Equal(t, m.Kernels[0].Params[1].DType, "int32")

	for _, tc := range []struct{ edit, want string }{
		{`{"format_version":2}`, "format version 2, this kiln reads 1"},
		{`{"kind":"opencl"}`, `kind "opencl", want cuda`},
		{`{"arch":"compute_80"}`, `architecture "compute_80" is not sm_NN`},
		{`{"ptx":"","cubins":{}}`, "neither PTX nor a cubin"},
		{`{"cubins":{"x86":"a"}}`, `cubin architecture "x86" is not sm_NN`},
		{`{"kernels":[{"name":"a b","grid":[1,1,1],"block":[1,1,1]}]}`, `name "a b" is not a C identifier`},
		{`{"kernels":[{"name":"k","grid":[1,1,1],"block":[1,1,1]},{"name":"k","grid":[1,1,1],"block":[1,1,1]}]}`, `kernel "k" listed twice`},
		{`{"kernels":[{"name":"k","grid":[1,1,1],"block":[0,1,1]}]}`, `kernel "k": block dimension x is 0`},
		{`{"kernels":[{"name":"k","grid":[1,-1,1],"block":[1,1,1]}]}`, `kernel "k": grid dimension y is -1`},
		{`{"kernels":[{"name":"k","grid":[1,1,1],"block":[1,1,1],"shared_bytes":-4}]}`, `kernel "k": shared memory -4+0 bytes out of range`},
		{`{"kernels":[{"name":"k","grid":[1,1,1],"block":[1,1,1],"params":[{"name":"p","dtype":"float8"}]}]}`, `kernel "k" parameter 0 ("p"): unknown dtype "float8"`},
	} {
		var doc map[string]any
		check.NoError(t, json.Unmarshal([]byte(goodDevice), &doc))
		var edit map[string]any
		check.NoError(t, json.Unmarshal([]byte(tc.edit), &edit))
		for k, v := range edit {
			doc[k] = v
		}
		b, err := json.Marshal(doc)
		check.NoError(t, err)
		_, err = ParseDeviceMetadata(b)
		check.Error(t, err, tc.want)
	}
	_, err = ParseDeviceMetadata([]byte("{"))
	check.Error(t, err, "device metadata: unexpected end of JSON input")
}

// FuzzParseDeviceMetadata: any input is either refused with an error or
// gives metadata that passes its own checks again after a round trip.
func FuzzParseDeviceMetadata(f *testing.F) {
	f.Add([]byte(goodDevice))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseDeviceMetadata(b)
		if err != nil {
			return
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseDeviceMetadata(out); err != nil {
			t.Fatalf("accepted %q but not its round trip: %v", b, err)
		}
	})
}
