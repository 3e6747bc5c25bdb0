//go:build !race

package compilernode_test

// streamedModuleSize is TestNodeBuildsStreamedModule's module: 200 MiB,
// over the 64 MiB frame that carried every module before it was streamed.
const streamedModuleSize = 200 << 20
