// Package waittest is the module's one way for a test to wait for a
// condition it cannot be told of: Until polls it, with a short backoff,
// until it holds, and fails the test after a timeout naming what it waited
// for and what it saw last. A test that can wait on a channel, a
// subscription or testing/synctest does that instead.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Only test files and other test helpers import it, as every test helper
// (internal/layers/doc.go); it imports the standard library alone.
package waittest
