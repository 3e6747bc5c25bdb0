// Package abi owns the kernel ABI of kiln's compiled modules: the C header
// that generated and hand-written kernels include, the argument type codes
// shared by Go and C, and the module metadata document that every module
// exports through kiln_module_metadata().
//
// abi is a leaf: it imports nothing from kiln.
package abi

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
)

// Header is the text of kiln_abi.h, written next to generated C sources.
//
//go:embed kiln_abi.h
var Header string

// HeaderName is the file name generated sources include.
const HeaderName = "kiln_abi.h"

// Version is the ABI and metadata format version this build speaks.
const Version = 1

// VersionRet is the module metadata format of a module with a function
// that returns a scalar (FuncInfo.Ret): such a function has TVM's packed
// signature with ret_value and ret_tcode (KilnPackedFuncRet in
// kiln_abi.h). A module without one is written as Version, which every
// kiln reads; a kiln that predates results refuses VersionRet by its
// number instead of calling such a function with too few arguments.
const VersionRet = 2

// TypeCode is the type code of one packed argument.
type TypeCode int32

// Type codes of packed arguments; the values match kiln_abi.h and TVM.
const (
	CodeInt      TypeCode = 0
	CodeUInt     TypeCode = 1
	CodeFloat    TypeCode = 2
	CodeHandle   TypeCode = 3
	CodeNull     TypeCode = 4
	CodeDType    TypeCode = 5
	CodeDevice   TypeCode = 6
	CodeDLTensor TypeCode = 7
	CodeStr      TypeCode = 11
	CodeBytes    TypeCode = 12
)

// String names the type code as error messages show it.
func (c TypeCode) String() string {
	switch c {
	case CodeInt:
		return "int"
	case CodeUInt:
		return "uint"
	case CodeFloat:
		return "float"
	case CodeHandle:
		return "handle"
	case CodeNull:
		return "null"
	case CodeDType:
		return "dtype"
	case CodeDevice:
		return "device"
	case CodeDLTensor:
		return "tensor"
	case CodeStr:
		return "str"
	case CodeBytes:
		return "bytes"
	}
	return fmt.Sprintf("typecode(%d)", int32(c))
}

// Param kinds in function metadata.
const (
	ParamTensor = "tensor"
	ParamInt    = "int"
	ParamFloat  = "float"
	ParamHandle = "handle"
)

// Metadata is the JSON document returned by kiln_module_metadata().
type Metadata struct {
	FormatVersion int        `json:"format_version"`
	Target        string     `json:"target"`
	Functions     []FuncInfo `json:"functions"`
}

// FuncInfo describes one exported function.
type FuncInfo struct {
	Name   string      `json:"name"`
	Params []ParamInfo `json:"params"`
	// Symbol is the exported C symbol when it differs from Name (a name
	// such as "exp" would clash with the C library's).
	Symbol string `json:"symbol,omitempty"`
	// Ret is the dtype of the scalar the function returns ("int64",
	// "float32", "bool"), empty for none; see VersionRet.
	Ret string `json:"ret,omitempty"`
}

// RetKind is the kind of the function's result, ParamInt or ParamFloat
// (a bool is returned as an integer), or "" for none.
func (f FuncInfo) RetKind() string {
	switch {
	case f.Ret == "":
		return ""
	case strings.HasPrefix(f.Ret, "float"):
		return ParamFloat
	}
	return ParamInt
}

// SymbolName is the C symbol that exports the function.
func (f FuncInfo) SymbolName() string {
	if f.Symbol != "" {
		return f.Symbol
	}
	return f.Name
}

// ParamInfo describes one parameter. For tensors, DType is a dtype string
// ("float32") and Shape has one entry per dimension: a number for a static
// extent, or a name for a symbolic one (all parameters that use the same
// name must agree at a call). A nil Shape means any shape.
type ParamInfo struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	DType string `json:"dtype,omitempty"`
	Shape []Dim  `json:"shape,omitempty"`
	// Output says the function writes the tensor (a result, or an
	// argument it updates in place), so a caller need not supply it and
	// reads it back after the call. Every other tensor is only read.
	Output bool `json:"output,omitempty"`
}

// Outputs names the tensor parameters the function writes. Metadata
// written before parameters were marked marks none; for it Outputs falls
// back to TVM's convention, the last tensor parameter.
func (f FuncInfo) Outputs() []string {
	var out []string
	last := ""
	for _, p := range f.Params {
		if p.Kind != ParamTensor {
			continue
		}
		last = p.Name
		if p.Output {
			out = append(out, p.Name)
		}
	}
	if out == nil && last != "" {
		out = []string{last}
	}
	return out
}

// Dim is one dimension in metadata: static (Name empty) or symbolic.
type Dim struct {
	Value int64
	Name  string
}

// MarshalJSON writes a static dimension as a number and a symbolic one as
// a string.
func (d Dim) MarshalJSON() ([]byte, error) {
	if d.Name != "" {
		return json.Marshal(d.Name)
	}
	return json.Marshal(d.Value)
}

// UnmarshalJSON reads a number or a string.
func (d *Dim) UnmarshalJSON(b []byte) error {
	var n int64
	if err := json.Unmarshal(b, &n); err == nil {
		*d = Dim{Value: n}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("dimension %s: want a number or a name", b)
	}
	if s == "" {
		return fmt.Errorf("dimension: empty name")
	}
	*d = Dim{Name: s}
	return nil
}

// retDTypes are the dtypes a function may return.
var retDTypes = map[string]bool{
	"int8": true, "int16": true, "int32": true, "int64": true,
	"uint8": true, "uint16": true, "uint32": true, "uint64": true,
	"bool": true, "float32": true, "float64": true,
}

// ParseMetadata decodes and validates a module's metadata document.
func ParseMetadata(b []byte) (*Metadata, error) {
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("module metadata: %w", err)
	}
	if m.FormatVersion != Version && m.FormatVersion != VersionRet {
		return nil, fmt.Errorf("module metadata: format version %d, this kiln reads %d and %d", m.FormatVersion, Version, VersionRet)
	}
	seen := map[string]bool{}
	for i, f := range m.Functions {
		if f.Name == "" {
			return nil, fmt.Errorf("module metadata: function %d has no name", i)
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("module metadata: function %q listed twice", f.Name)
		}
		seen[f.Name] = true
		if f.Ret != "" {
			if m.FormatVersion != VersionRet {
				return nil, fmt.Errorf("module metadata: function %q returns %s, which format version %d cannot say (want %d)", f.Name, f.Ret, m.FormatVersion, VersionRet)
			}
			if !retDTypes[f.Ret] {
				return nil, fmt.Errorf("module metadata: function %q returns %q: want a scalar integer, bool, float32 or float64", f.Name, f.Ret)
			}
		}
		for j, p := range f.Params {
			switch p.Kind {
			case ParamTensor, ParamInt, ParamFloat, ParamHandle:
			default:
				return nil, fmt.Errorf("module metadata: function %q parameter %d (%q): unknown kind %q", f.Name, j, p.Name, p.Kind)
			}
		}
	}
	return &m, nil
}
