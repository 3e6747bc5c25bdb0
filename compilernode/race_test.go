//go:build race

package compilernode_test

// streamedModuleSize is TestNodeBuildsStreamedModule's module under the
// race detector: still streamed both ways (over proto.MaxInlineModule),
// small enough for the instrumented parser to take in seconds.
const streamedModuleSize = 2 << 20
