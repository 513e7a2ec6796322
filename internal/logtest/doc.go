// Package logtest is the log destination of the module's tests: Buffer, a
// bytes.Buffer that a logger's goroutines and the test may use at once,
// with what the tests read from it (the text, the JSON records at a level,
// a signal on each write).
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Only test files and other test helpers import it, as every test helper
// (internal/layers/doc.go); it imports the standard library alone.
package logtest
