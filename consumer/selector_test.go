package consumer_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func TestParseSelectorErrors(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 64)
	tests := []struct {
		name     string
		selector string
		// want are parts of the message after the quoted selector: the
		// column, the bad token, key or value, and the rule.
		want []string
	}{
		{name: "a trailing comma wants another requirement", selector: "app=web,", want: []string{"column 9", "found the end, want a key or '!'"}},
		{name: "a leading comma wants a key", selector: ",app", want: []string{"column 1", "found ','"}},
		{name: "two commas in a row want a key between", selector: "app,,tier", want: []string{"column 5", "found ','"}},
		{name: "an unclosed value list is reported at its end", selector: "env in (prod", want: []string{"column 13", "found the end in the values of 'env in', want a value, ',' or ')'"}},
		{name: "in without a list wants '('", selector: "env in prod", want: []string{"column 8", `found "prod" after 'env in', want '('`}},
		{name: "values in a list are separated by commas", selector: "env in (a b)", want: []string{"column 11", `found "b"`}},
		{name: "two keys without an operator", selector: "app web", want: []string{"column 5", `found "web" after key "app", want an operator`}},
		{name: "an operator after a negated key", selector: "!app=web", want: []string{"column 5", "'!' takes a key alone"}},
		{name: "'!' wants a key", selector: "!=web", want: []string{"column 1", "found '!=', want a key or '!'"}},
		{name: "a second value after '='", selector: "a=b=c", want: []string{"column 4", `found '=' after requirement "a=b", want ',' or the end`}},
		{name: "'=' followed by a parenthesis", selector: "a=(b)", want: []string{"column 3", "found '(' after 'a=', want a value"}},
		{name: "a key that starts with a dash", selector: "-app=web", want: []string{"column 1", `key "-app" has a name that starts with "-"`, "[A-Za-z0-9]"}},
		{name: "a key with a space inside is two words", selector: "my app=web", want: []string{"column 4", `found "app"`}},
		{name: "a key name of 64 characters", selector: long + "=x", want: []string{"column 1", "has a name of 64 characters", "at most 63"}},
		{name: "a key with two slashes", selector: "a/b/c", want: []string{"column 1", `key "a/b/c" has more than one '/'`}},
		{name: "a key with an empty prefix", selector: "/app", want: []string{`key "/app" has a prefix "" that is empty`, "DNS subdomain"}},
		{name: "a key with an uppercase prefix", selector: "Example.com/app", want: []string{`prefix "Example.com" that has part "Example" that starts with "E"`, "[a-z0-9]"}},
		{name: "a key with an empty name after the prefix", selector: "example.com/", want: []string{`key "example.com/" has an empty name`}},
		{name: "a value that ends with a dot", selector: "app=web.", want: []string{"column 5", `value "web." of key "app" ends with "."`, "[-_.A-Za-z0-9]"}},
		{name: "a value with a slash", selector: "app in (a/b)", want: []string{"column 9", `value "a/b" of key "app" has "/" at byte 1`}},
		{name: "a value of 64 characters", selector: "app=" + long, want: []string{"column 5", "has 64 characters", "at most 63"}},
		{name: "a non-ASCII value", selector: "app=naïve", want: []string{"column 5", `value "naïve" of key "app" has "ï" at byte 2`}},
		{name: "'>' wants an integer", selector: "replicas>three", want: []string{"column 10", `value "three" of key "replicas" is not a decimal integer`}},
		{name: "'<' wants a value", selector: "replicas<", want: []string{"column 10", `value "" of key "replicas" is not a decimal integer`}},
		{name: "'>=' is not an operator", selector: "replicas>=1", want: []string{"column 10", "found '=' after 'replicas>', want a value"}},
		{name: "an integer beyond int64", selector: "n>99999999999999999999", want: []string{`value "99999999999999999999" of key "n" is not a decimal integer (int64)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sel, err := consumer.ParseSelector(tt.selector)
			if err == nil {
				t.Fatalf("ParseSelector(%q) = %q, want an error", tt.selector, sel)
			}
			if !errors.Is(err, consumer.ErrInvalidSelector) {
				t.Errorf("error %v does not wrap ErrInvalidSelector", err)
			}
			msg := err.Error()
			for _, w := range append([]string{"invalid label selector " + strconv.Quote(tt.selector)}, tt.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
		})
	}
}

func TestSelectorMatches(t *testing.T) {
	t.Parallel()
	web := map[string]string{"app": "web", "env": "prod", "replicas": "3"}
	tests := []struct {
		name     string
		selector string
		labels   map[string]string
		want     bool
	}{
		{name: "the empty selector matches unknown labels", selector: "", labels: nil, want: true},
		{name: "space alone is the empty selector", selector: " \t\n", labels: web, want: true},
		{name: "= matches the same value", selector: "app=web", labels: web, want: true},
		{name: "== matches the same value", selector: "app==web", labels: web, want: true},
		{name: "= does not match another value", selector: "app=db", labels: web, want: false},
		{name: "= does not match a missing key", selector: "tier=db", labels: web, want: false},
		{name: "!= matches another value", selector: "app!=db", labels: web, want: true},
		{name: "!= does not match the same value", selector: "app!=web", labels: web, want: false},
		{name: "!= matches a missing key", selector: "tier!=db", labels: web, want: true},
		{name: "!= matches unknown labels", selector: "app!=web", labels: nil, want: true},
		{name: "= with no value matches an empty value", selector: "app=", labels: map[string]string{"app": ""}, want: true},
		{name: "= with no value does not match a missing key", selector: "app=", labels: nil, want: false},
		{name: "in matches a listed value", selector: "env in (prod,stage)", labels: web, want: true},
		{name: "in does not match an unlisted value", selector: "env in (dev)", labels: web, want: false},
		{name: "in does not match a missing key", selector: "tier in (db)", labels: web, want: false},
		{name: "in () matches the empty value", selector: "env in ()", labels: map[string]string{"env": ""}, want: true},
		{name: "an empty item in a list is the empty value", selector: "env in (,prod)", labels: map[string]string{"env": ""}, want: true},
		{name: "notin matches an unlisted value", selector: "env notin (dev)", labels: web, want: true},
		{name: "notin does not match a listed value", selector: "env notin (dev,prod)", labels: web, want: false},
		{name: "notin matches a missing key", selector: "tier notin (db)", labels: web, want: true},
		{name: "a key alone matches when the key is there", selector: "app", labels: web, want: true},
		{name: "a key alone matches an empty value", selector: "app", labels: map[string]string{"app": ""}, want: true},
		{name: "a key alone does not match a missing key", selector: "canary", labels: web, want: false},
		{name: "!key matches a missing key", selector: "!canary", labels: web, want: true},
		{name: "!key does not match a present key", selector: "!app", labels: web, want: false},
		{name: "requirements are ANDed", selector: "app=web,env in (prod),!canary", labels: web, want: true},
		{name: "one failing requirement fails the selector", selector: "app=web,env=dev", labels: web, want: false},
		{name: "contradicting requirements on one key match nothing", selector: "app=web,app=db", labels: web, want: false},
		{name: "space around tokens is ignored", selector: "  app = web ,  env  in(prod) ", labels: web, want: true},
		{name: "a prefixed key matches", selector: "app.kubernetes.io/name=web", labels: map[string]string{"app.kubernetes.io/name": "web"}, want: true},
		{name: "in is a key where a key is expected", selector: "in in (in)", labels: map[string]string{"in": "in"}, want: true},
		{name: "> compares integers", selector: "replicas>2", labels: web, want: true},
		{name: "> is strict", selector: "replicas>3", labels: web, want: false},
		{name: "< compares integers", selector: "replicas<10", labels: web, want: true},
		{name: "> reads a label value with a sign", selector: "n>5", labels: map[string]string{"n": "+7"}, want: true},
		{name: "< reads a negative label value", selector: "n<0", labels: map[string]string{"n": "-3"}, want: true},
		{name: "> does not match a non-integer value", selector: "app>0", labels: web, want: false},
		{name: "> does not match a missing key", selector: "tier>0", labels: web, want: false},
		{name: "a NUL byte after space ends the selector", selector: "app=web \x00 garbage", labels: web, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sel, err := consumer.ParseSelector(tt.selector)
			if err != nil {
				t.Fatalf("ParseSelector(%q): %v", tt.selector, err)
			}
			if got := sel.Matches(tt.labels); got != tt.want {
				t.Errorf("ParseSelector(%q).Matches(%v) = %v, want %v", tt.selector, tt.labels, got, tt.want)
			}
		})
	}
}

func TestSelectorZeroValueSelectsEverything(t *testing.T) {
	t.Parallel()
	var sel consumer.Selector
	if !sel.Empty() || sel.String() != "" || !sel.Matches(nil) || !sel.Matches(map[string]string{"app": "web"}) {
		t.Errorf("zero Selector: Empty %v, String %q, Matches(nil) %v; want true, \"\", true", sel.Empty(), sel.String(), sel.Matches(nil))
	}
	parsed, err := consumer.ParseSelector("")
	if err != nil || !parsed.Empty() {
		t.Errorf(`ParseSelector("") = %q, %v; want an empty selector`, parsed, err)
	}
}

func TestSelectorString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		selector string
		want     string
	}{
		{name: "space is dropped", selector: " app = web ", want: "app=web"},
		{name: "== is kept as written", selector: "app==web", want: "app==web"},
		{name: "requirements are sorted by key", selector: "tier!=db,app=web,!canary", want: "app=web,!canary,tier!=db"},
		{name: "requirements on one key keep their order", selector: "b,a=2,a=1", want: "a=2,a=1,b"},
		{name: "a value list is sorted without duplicates", selector: "env in (stage, prod,stage)", want: "env in (prod,stage)"},
		{name: "notin keeps its spaces", selector: "env notin(dev)", want: "env notin (dev)"},
		{name: "the empty value comes first in a list", selector: "env in (prod,)", want: "env in (,prod)"},
		{name: "in () is kept", selector: "env in ()", want: "env in ()"},
		{name: "an empty value after = is kept", selector: "app=,tier", want: "app=,tier"},
		{name: "keywords as key and value are kept", selector: "in in (notin)", want: "in in (notin)"},
		{name: "> and < are kept", selector: "n > 1, m<007", want: "m<007,n>1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sel, err := consumer.ParseSelector(tt.selector)
			if err != nil {
				t.Fatalf("ParseSelector(%q): %v", tt.selector, err)
			}
			if diff := cmp.Diff(tt.want, sel.String()); diff != "" {
				t.Errorf("ParseSelector(%q).String() (-want +got):\n%s", tt.selector, diff)
			}
			again, err := consumer.ParseSelector(sel.String())
			if err != nil {
				t.Fatalf("ParseSelector(%q), the String of %q: %v", sel.String(), tt.selector, err)
			}
			if again.String() != sel.String() {
				t.Errorf("String does not round-trip: %q parses to %q", sel.String(), again.String())
			}
		})
	}
}

func TestFailed(t *testing.T) {
	t.Parallel()
	event := func(lifecycle string, code *int32, reason string) consumer.Event {
		return consumer.Event{
			Type: "pleg.v1." + lifecycle,
			Data: schemas.EventData{ExitCode: code, Reason: reason},
		}
	}
	tests := []struct {
		name  string
		event consumer.Event
		want  bool
	}{
		{name: "a start is not a failure", event: event("ContainerStarted", nil, ""), want: false},
		{name: "a death with exit code 0 is not a failure", event: event("ContainerDied", exitCode(0), ""), want: false},
		{name: "a death with exit code 0 and reason Completed is not a failure", event: event("ContainerDied", exitCode(0), "Completed"), want: false},
		{name: "a death with exit code 137 is a failure", event: event("ContainerDied", exitCode(137), ""), want: true},
		{name: "a death with exit code 1 and reason Error is a failure", event: event("ContainerDied", exitCode(1), "Error"), want: true},
		{name: "an OOM kill reported with exit code 0 is a failure", event: event("ContainerDied", exitCode(0), "OOMKilled"), want: true},
		{name: "a death without exit code but with a reason is a failure", event: event("ContainerDied", nil, "ContainerCannotRun"), want: true},
		{name: "a death without exit code or reason is not a failure", event: event("ContainerDied", nil, ""), want: false},
		{name: "a removal carrying an exit code is not a failure", event: event("ContainerRemoved", exitCode(137), "Error"), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := consumer.Failed(tt.event); got != tt.want {
				t.Errorf("Failed(%s, exit %v, reason %q) = %v, want %v", tt.event.Type, tt.event.Data.ExitCode, tt.event.Data.Reason, got, tt.want)
			}
		})
	}
}

func TestValidateNamespace(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		namespace string
		want      string // part of the error, "" for none
	}{
		{name: "default is valid", namespace: "default"},
		{name: "a dash inside is valid", namespace: "kube-system"},
		{name: "one character is valid", namespace: "a"},
		{name: "a leading digit is valid", namespace: "1abc"},
		{name: "63 characters are valid", namespace: strings.Repeat("a", 63)},
		{name: "empty is invalid", namespace: "", want: "is empty"},
		{name: "64 characters are invalid", namespace: strings.Repeat("a", 64), want: "has 64 characters"},
		{name: "uppercase is invalid", namespace: "Default", want: `starts with "D"`},
		{name: "a leading dash is invalid", namespace: "-ns", want: `starts with "-"`},
		{name: "a trailing dash is invalid", namespace: "ns-", want: `ends with "-"`},
		{name: "a dot is invalid", namespace: "a.b", want: `has "." at byte 1`},
		{name: "an underscore is invalid", namespace: "a_b", want: `has "_" at byte 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := consumer.ValidateNamespace(tt.namespace)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ValidateNamespace(%q): %v", tt.namespace, err)
				}
				return
			}
			if !errors.Is(err, consumer.ErrInvalidNamespace) {
				t.Fatalf("ValidateNamespace(%q) = %v, want an error wrapping ErrInvalidNamespace", tt.namespace, err)
			}
			for _, w := range []string{strconv.Quote(tt.namespace), tt.want, "a namespace is a DNS label"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
