// Package layers holds the module's import rules as a test: TestImportRules
// (layers_test.go) reads the import graph with `go list` and checks each
// package against what its doc.go says it may and must not import.
//
// The rules live in the packages' doc.go files, in prose a reader finds
// beside the code; the table in rules_test.go restates each of them, one
// entry per doc.go, and a failure names the arrow that broke a rule and the
// doc.go that states it. A change of layout changes both: the prose in the
// doc.go and its entry in the table. TestRuleTableMatchesDocs keeps the two
// together: every doc.go that states an import rule has an entry, and points
// here.
//
// Besides the rules of each doc.go, two hold for every package:
//   - nothing imports a package under cmd/, test files included;
//   - a test helper package (its name ends in "test": generatortest,
//     publishtest, ...) is imported only by test files and by other test
//     helpers, never by the product, the harnesses or the commands.
//
// An arrow that breaks a rule today, and that is being fixed elsewhere, is
// listed in knownViolations with the reason it exists: the test logs it
// instead of failing, and fails once it is gone, so that the entry is
// removed with the arrow. The list should be empty.
//
// The test runs `go list` from the module, so it needs the go command on
// PATH and the module's dependencies downloaded (go mod download); it needs
// no network beyond that and takes about a second. This package has no
// code: nothing imports it.
package layers
