package publish

// SubjectCovers exposes subjectCovers to the external tests.
var SubjectCovers = subjectCovers
