package consumer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrInvalidSelector is wrapped by the errors of ParseSelector.
var ErrInvalidSelector = errors.New("invalid label selector")

// ErrInvalidNamespace is wrapped by the errors of ValidateNamespace.
var ErrInvalidNamespace = errors.New("invalid namespace")

// Length limits of Kubernetes names, in bytes.
const (
	labelNameMaxLen    = 63  // the name part of a label key, and a label value
	dnsLabelMaxLen     = 63  // a namespace
	dnsSubdomainMaxLen = 253 // the prefix of a label key
)

// The rules of the validation errors, as ParseSelector and
// ValidateNamespace state them.
const (
	labelNameRule    = "a label key's name and a label value have at most 63 characters, start and end with [A-Za-z0-9] and have only [-_.A-Za-z0-9] between (a value may also be empty)"
	dnsSubdomainRule = "a label key's prefix is a DNS subdomain: at most 253 characters, dot-separated parts of [-a-z0-9] that start and end with [a-z0-9]"
	namespaceRule    = "a namespace is a DNS label: 1 to 63 characters, [-a-z0-9] that start and end with [a-z0-9]"
)

// Selector is a parsed Kubernetes label selector, as `kubectl get -l`
// takes it. The zero value selects everything. A Selector is immutable and
// safe for concurrent use.
//
// It behaves as k8s.io/apimachinery/pkg/labels (labels.Parse, then
// Matches(labels.Set(m))) does, which selector_diff_test.go checks, without
// importing it: apimachinery would bring klog and more to every service
// that imports consumer.
type Selector struct {
	// reqs are ANDed, sorted by key; requirements on the same key keep
	// their order in the text.
	reqs []requirement
}

// requirement is one comma-separated term of a selector.
type requirement struct {
	key string
	op  operator
	// values holds one value for the exact operators (=, ==, !=, >, <), at
	// least one for in and notin (sorted, without duplicates), and none for
	// exists and does-not-exist. "" is a value.
	values []string
}

type operator uint8

const (
	opExists       operator = iota // key
	opDoesNotExist                 // !key
	opEquals                       // key=value
	opDoubleEquals                 // key==value
	opNotEquals                    // key!=value
	opIn                           // key in (v1,v2)
	opNotIn                        // key notin (v1,v2)
	opGreaterThan                  // key>integer
	opLessThan                     // key<integer
)

// ParseSelector parses Kubernetes' label selector syntax: equality
// (`app=web`, `app==web`, `tier!=db`), set-based (`env in (prod,stage)`,
// `env notin (dev)`), existence (`canary`, `!canary`), comma-separated
// requirements ANDed, surrounding space ignored. "" selects everything.
// Like Kubernetes it also takes `key>n` and `key<n` with n a decimal
// integer, `key=` for an empty value, and `()` or empty items in a value
// list (`env in (,prod)`) for the empty value.
//
// A syntax error, or a key or value that breaks Kubernetes' rules, is an
// error wrapping ErrInvalidSelector that names the selector, the column at
// fault (counted in bytes from 1) and what is wrong there (the bad key or
// value and the rule it breaks). A key is a name of at most 63 characters, [A-Za-z0-9] at the
// ends and [-_.A-Za-z0-9] between, with an optional DNS subdomain prefix
// and '/' (example.com/app); a value is empty or follows the rule of the
// name.
//
// Two oddities of Kubernetes' parser are kept so that a selector means the
// same here as in kubectl: `in` and `notin` are operators only where an
// operator is expected (`in in (in)` is valid), and a NUL byte ends the
// token it follows and, where a token would start, the whole selector
// ("app \x00 garbage" is "app").
func ParseSelector(s string) (Selector, error) {
	p := selectorParser{src: s, toks: lexSelector(s)}
	if p.peek().kind == tokEnd {
		return Selector{}, nil
	}
	var reqs []requirement
	for {
		r, err := p.requirement()
		if err != nil {
			return Selector{}, err
		}
		reqs = append(reqs, r)
		switch t := p.next(); t.kind {
		case tokEnd:
			slices.SortStableFunc(reqs, func(a, b requirement) int { return strings.Compare(a.key, b.key) })
			return Selector{reqs: reqs}, nil
		case tokComma:
		default:
			return Selector{}, p.errorf(t.pos, "found %s after requirement %q, want ',' or the end", t, r)
		}
	}
}

// Matches reports whether labels satisfy every requirement of s. A key
// missing from labels (or nil labels, as for an event whose pod's labels
// the bridge does not know) satisfies `!key`, `key!=v` and `key notin (…)`
// and nothing else. `key>n` and `key<n` hold only if the label's value is
// a decimal integer (a sign allowed) compared as int64.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.reqs {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

// Empty reports whether s selects everything: it has no requirements.
func (s Selector) Empty() bool {
	return len(s.reqs) == 0
}

// String returns s in canonical form, which ParseSelector reads back as
// the same selector: requirements sorted by key without space but for
// " in " and " notin ", value lists sorted without duplicates. It is the
// form apimachinery's Selector.String gives, so `==` stays `==`.
func (s Selector) String() string {
	var b strings.Builder
	for i, r := range s.reqs {
		if i > 0 {
			b.WriteByte(',')
		}
		r.writeTo(&b)
	}
	return b.String()
}

func (r requirement) String() string {
	var b strings.Builder
	r.writeTo(&b)
	return b.String()
}

func (r requirement) writeTo(b *strings.Builder) {
	if r.op == opDoesNotExist {
		b.WriteByte('!')
	}
	b.WriteString(r.key)
	switch r.op {
	case opExists, opDoesNotExist:
		return
	case opIn:
		b.WriteString(" in (" + strings.Join(r.values, ",") + ")")
		return
	case opNotIn:
		b.WriteString(" notin (" + strings.Join(r.values, ",") + ")")
		return
	case opEquals:
		b.WriteByte('=')
	case opDoubleEquals:
		b.WriteString("==")
	case opNotEquals:
		b.WriteString("!=")
	case opGreaterThan:
		b.WriteByte('>')
	case opLessThan:
		b.WriteByte('<')
	}
	b.WriteString(r.values[0])
}

func (r requirement) matches(labels map[string]string) bool {
	v, ok := labels[r.key]
	switch r.op {
	case opExists:
		return ok
	case opDoesNotExist:
		return !ok
	case opEquals, opDoubleEquals, opIn:
		return ok && slices.Contains(r.values, v)
	case opNotEquals, opNotIn:
		return !ok || !slices.Contains(r.values, v)
	case opGreaterThan, opLessThan:
		if !ok {
			return false
		}
		// Label values in a map are not validated, so "+7" and "-3" are
		// read as numbers here, as apimachinery reads them.
		have, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return false
		}
		want, _ := strconv.ParseInt(r.values[0], 10, 64) // checked by ParseSelector
		if r.op == opGreaterThan {
			return have > want
		}
		return have < want
	}
	return false
}

// Failed reports whether the event reports a failure: a ContainerDied with
// a non-zero exit code, or with a reason other than "" and "Completed"
// (OOMKilled, Error, ContainerCannotRun, …), even if the exit code is 0 or
// unknown.
func Failed(e Event) bool {
	if e.LifecycleType() != "ContainerDied" {
		return false
	}
	if code, ok := e.ExitCode(); ok && code != 0 {
		return true
	}
	return e.Data.Reason != "" && e.Data.Reason != "Completed"
}

// ValidateNamespace returns nil if ns is a valid Kubernetes namespace name,
// a DNS-1123 label: 1 to 63 characters, lowercase alphanumerics and '-',
// starting and ending with an alphanumeric. Otherwise it returns an error
// wrapping ErrInvalidNamespace that names ns, what is wrong and the rule.
func ValidateNamespace(ns string) error {
	var problem string
	switch {
	case ns == "":
		problem = "is empty"
	case len(ns) > dnsLabelMaxLen:
		problem = fmt.Sprintf("has %d characters", len(ns))
	default:
		if i := badByte(ns, isLowerAlnum, isDNSInside); i >= 0 {
			problem = describeBadByte(ns, i)
		}
	}
	if problem == "" {
		return nil
	}
	return fmt.Errorf("%w %q: %s; %s", ErrInvalidNamespace, ns, problem, namespaceRule)
}

// selectorParser reads the tokens of a selector by recursive descent. It
// follows the grammar of apimachinery's parser, in which the token after an
// operator or inside a value list is always a value, so `in` and `notin`
// are keywords only in operator position.
type selectorParser struct {
	src  string
	toks []token // ending with one tokEnd
	i    int
}

func (p *selectorParser) peek() token { return p.toks[p.i] }

// next returns the next token and moves past it, except past the end.
func (p *selectorParser) next() token {
	t := p.toks[p.i]
	if t.kind != tokEnd {
		p.i++
	}
	return t
}

func (p *selectorParser) errorf(pos int, format string, args ...any) error {
	return fmt.Errorf("%w %q: column %d: %s", ErrInvalidSelector, p.src, pos+1, fmt.Sprintf(format, args...))
}

// requirement parses `[!]key [operator value | in|notin (values)]`.
func (p *selectorParser) requirement() (requirement, error) {
	negated := p.peek().kind == tokNot
	if negated {
		p.next()
	}
	kt := p.next()
	if kt.kind != tokWord {
		want := "a key or '!'"
		if negated {
			want = "a key after '!'"
		}
		return requirement{}, p.errorf(kt.pos, "found %s, want %s", kt, want)
	}
	if problem := labelKeyProblem(kt.text); problem != "" {
		return requirement{}, p.errorf(kt.pos, "key %q %s", kt.text, problem)
	}
	r := requirement{key: kt.text}
	if k := p.peek().kind; k == tokEnd || k == tokComma {
		r.op = opExists
		if negated {
			r.op = opDoesNotExist
		}
		return r, nil
	}
	if negated {
		t := p.peek()
		return requirement{}, p.errorf(t.pos, "found %s after '!%s', want ',' or the end: '!' takes a key alone", t, r.key)
	}

	ot := p.next()
	var values []token
	switch op, ok := operatorOf(ot); {
	case ok && (op == opIn || op == opNotIn):
		r.op = op
		var err error
		if values, err = p.valueList(r.key, ot.text); err != nil {
			return requirement{}, err
		}
	case ok:
		r.op = op
		// A missing value before ',' or the end is the empty value.
		v := token{kind: tokWord, pos: p.peek().pos}
		switch t := p.peek(); t.kind {
		case tokWord:
			v = p.next()
		case tokEnd, tokComma:
		default:
			return requirement{}, p.errorf(t.pos, "found %s after '%s%s', want a value", t, r.key, ot.text)
		}
		values = []token{v}
	default:
		return requirement{}, p.errorf(ot.pos, "found %s after key %q, want an operator (=, ==, !=, in, notin, >, <), ',' or the end", ot, r.key)
	}

	for _, v := range values {
		if problem := labelValueProblem(v.text); problem != "" {
			return requirement{}, p.errorf(v.pos, "value %q of key %q %s", v.text, r.key, problem)
		}
		if r.op == opGreaterThan || r.op == opLessThan {
			if _, err := strconv.ParseInt(v.text, 10, 64); err != nil {
				return requirement{}, p.errorf(v.pos, "value %q of key %q is not a decimal integer (int64), which '%s' compares", v.text, r.key, ot.text)
			}
		}
		r.values = append(r.values, v.text)
	}
	slices.Sort(r.values)
	r.values = slices.Compact(r.values)
	return r, nil
}

// operatorOf returns the binary operator that t, read where an operator
// is expected, stands for.
func operatorOf(t token) (operator, bool) {
	switch t.kind {
	case tokWord:
		switch t.text {
		case "in":
			return opIn, true
		case "notin":
			return opNotIn, true
		}
	case tokEquals:
		return opEquals, true
	case tokDoubleEquals:
		return opDoubleEquals, true
	case tokNotEquals:
		return opNotEquals, true
	case tokGreater:
		return opGreaterThan, true
	case tokLess:
		return opLessThan, true
	}
	return 0, false
}

// valueList parses `(v1,v2,…)` after in or notin. An item may be empty,
// which is the value "": `()`, `(,a)` and `(a,)` hold "". The returned
// tokens of empty items have the position of what follows them.
func (p *selectorParser) valueList(key, op string) ([]token, error) {
	if t := p.next(); t.kind != tokOpen {
		return nil, p.errorf(t.pos, "found %s after '%s %s', want '('", t, key, op)
	}
	var values []token
	for {
		v := token{kind: tokWord, pos: p.peek().pos}
		if p.peek().kind == tokWord {
			v = p.next()
		}
		values = append(values, v)
		switch t := p.next(); t.kind {
		case tokComma:
		case tokClose:
			return values, nil
		default:
			return nil, p.errorf(t.pos, "found %s in the values of '%s %s', want a value, ',' or ')'", t, key, op)
		}
	}
}

type tokenKind uint8

const (
	tokEnd          tokenKind = iota
	tokWord                   // a key, a value, or the keyword in or notin
	tokNot                    // !
	tokEquals                 // =
	tokDoubleEquals           // ==
	tokNotEquals              // !=
	tokGreater                // >
	tokLess                   // <
	tokOpen                   // (
	tokClose                  // )
	tokComma                  // ,
)

// token is a lexeme of a selector and its byte offset.
type token struct {
	kind tokenKind
	text string
	pos  int
}

// String describes the token for an error message.
func (t token) String() string {
	switch t.kind {
	case tokEnd:
		return "the end"
	case tokWord:
		return strconv.Quote(t.text)
	}
	return "'" + t.text + "'"
}

// punctuation returns the token kind of a one-byte token.
func punctuation(c byte) (tokenKind, bool) {
	switch c {
	case '!':
		return tokNot, true
	case '=':
		return tokEquals, true
	case '>':
		return tokGreater, true
	case '<':
		return tokLess, true
	case '(':
		return tokOpen, true
	case ')':
		return tokClose, true
	case ',':
		return tokComma, true
	}
	return tokEnd, false
}

// lexSelector splits s into tokens, the last one tokEnd. Space is ' ',
// '\t', '\r' and '\n'; a word is a run of any other bytes but punctuation
// and NUL, so a bad byte shows up as a bad key or value. "!=" and "==" are
// one token each, read greedily ("!==" is "!=" then "=").
//
// A NUL byte is treated as apimachinery's lexer treats it, which reads it
// as its end-of-input marker: one directly after a token is skipped, and
// one where the next token would start (after space, or after the NUL that
// ended a token) ends the input.
func lexSelector(s string) []token {
	var toks []token
	i := 0
	for {
		for i < len(s) && isSelectorSpace(s[i]) {
			i++
		}
		if i == len(s) || s[i] == 0 {
			return append(toks, token{kind: tokEnd, pos: i})
		}
		start := i
		kind, punct := punctuation(s[i])
		switch {
		case punct:
			i++
			if i < len(s) && s[i] == '=' {
				switch kind {
				case tokNot:
					kind, i = tokNotEquals, i+1
				case tokEquals:
					kind, i = tokDoubleEquals, i+1
				}
			}
		default:
			kind = tokWord
			for i < len(s) && s[i] != 0 && !isSelectorSpace(s[i]) && !isPunctuation(s[i]) {
				i++
			}
		}
		toks = append(toks, token{kind: kind, text: s[start:i], pos: start})
		if i < len(s) && s[i] == 0 {
			i++
		}
	}
}

func isSelectorSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func isPunctuation(c byte) bool {
	_, ok := punctuation(c)
	return ok
}

// labelKeyProblem returns what makes k an invalid label key, "" if it is
// valid: an optional prefix (a DNS subdomain) and '/', then a name.
func labelKeyProblem(k string) string {
	prefix, name, prefixed := strings.Cut(k, "/")
	if !prefixed {
		name = k
	}
	if strings.Contains(name, "/") {
		return "has more than one '/'; a label key is a name with an optional DNS subdomain prefix and '/' (example.com/app)"
	}
	if prefixed {
		if problem := dnsSubdomainProblem(prefix); problem != "" {
			return fmt.Sprintf("has a prefix %q that %s; %s", prefix, problem, dnsSubdomainRule)
		}
	}
	switch {
	case name == "":
		return "has an empty name; " + labelNameRule
	case len(name) > labelNameMaxLen:
		return fmt.Sprintf("has a name of %d characters; %s", len(name), labelNameRule)
	}
	if i := badByte(name, isAlnum, isLabelInside); i >= 0 {
		return fmt.Sprintf("has a name that %s; %s", describeBadByte(name, i), labelNameRule)
	}
	return ""
}

// labelValueProblem returns what makes v an invalid label value, "" if it
// is valid.
func labelValueProblem(v string) string {
	if len(v) > labelNameMaxLen {
		return fmt.Sprintf("has %d characters; %s", len(v), labelNameRule)
	}
	if i := badByte(v, isAlnum, isLabelInside); i >= 0 {
		return describeBadByte(v, i) + "; " + labelNameRule
	}
	return ""
}

// dnsSubdomainProblem returns what makes s an invalid DNS-1123 subdomain
// in lowercase, "" if it is valid. Its dot-separated parts have no length
// limit of their own: apimachinery checks only the total.
func dnsSubdomainProblem(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > dnsSubdomainMaxLen {
		return fmt.Sprintf("has %d characters", len(s))
	}
	off := 0
	for part := range strings.SplitSeq(s, ".") {
		if part == "" {
			return fmt.Sprintf("has an empty part at byte %d", off)
		}
		if i := badByte(part, isLowerAlnum, isDNSInside); i >= 0 {
			return fmt.Sprintf("has part %q that %s", part, describeBadByte(part, i))
		}
		off += len(part) + 1
	}
	return ""
}

// badByte returns the index of the first byte of s that is not allowed,
// ends checked with end and the rest with inside, or -1.
func badByte(s string, end, inside func(byte) bool) int {
	for i := 0; i < len(s); i++ {
		allowed := inside
		if i == 0 || i == len(s)-1 {
			allowed = end
		}
		if !allowed(s[i]) {
			return i
		}
	}
	return -1
}

// describeBadByte says where the bad byte s[i] is, quoting the whole
// character if it starts a UTF-8 sequence.
func describeBadByte(s string, i int) string {
	_, size := utf8.DecodeRuneInString(s[i:])
	c := strconv.Quote(s[i : i+size])
	switch {
	case i == 0:
		return "starts with " + c
	case i+size == len(s):
		return "ends with " + c
	}
	return fmt.Sprintf("has %s at byte %d", c, i)
}

func isLowerAlnum(c byte) bool  { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
func isAlnum(c byte) bool       { return isLowerAlnum(c) || 'A' <= c && c <= 'Z' }
func isDNSInside(c byte) bool   { return isLowerAlnum(c) || c == '-' }
func isLabelInside(c byte) bool { return isAlnum(c) || c == '-' || c == '_' || c == '.' }
