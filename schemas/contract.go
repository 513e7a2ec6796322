package schemas

import (
	"strconv"
	"strings"
)

// ContractVersion is the version of the wire contract this build writes:
// the subject layout, the CloudEvent attributes and types, and the stream,
// archive and state bucket they are stored in. It goes up by one with
// every change that a reader or an operator must know of (CHANGELOG.md
// says what each changed), and it is written where a reader meets it: in
// every event's dataschema (SchemaBaseURI) and in the metadata of the
// stream, the archive and the state bucket.
//
// Version 1 published on <prefix>.<node>.<podUID>.<eventType>; version 2
// added the namespace token, <prefix>.<node>.<namespace>.<podUID>.<eventType>.
// Bridges of both versions wrote no contract version; a dataschema without
// one is theirs (ParseDataSchema).
const ContractVersion = "2"

// The keys of the contract in the metadata of the stream, the archive and
// the state bucket: the bridge that created one, or last changed its
// configuration, records there the contract version it publishes and its
// own pleg-bridge version (publish.EnsureStream says when).
const (
	MetadataContractVersion = "pleg-bridge.contract_version"
	MetadataVersion         = "pleg-bridge.version"
)

// ParseDataSchema reads the dataschema of a pleg-bridge CloudEvent: the
// CloudEvent type whose data schema it names, and the contract version of
// the bridge that wrote it. It accepts the dataschema of every contract
// version, https://pleg-bridge.dev/schemas/contract/<version>/v1/<Lifecycle
// event type>.json, newer ones than ContractVersion included, and that of
// the bridges from before contract versions were written,
// https://pleg-bridge.dev/schemas/v1/<Lifecycle event type>.json, for which
// contract is "" (version 1 or 2: the event's subject has no namespace
// token or has one). It reports false for any other URI and for a type
// pleg-bridge does not publish.
func ParseDataSchema(uri string) (ceType, contract string, ok bool) {
	rest, ok := strings.CutPrefix(uri, schemaHome)
	if !ok {
		return "", "", false
	}
	if r, found := strings.CutPrefix(rest, contractSegment); found {
		contract, rest, ok = strings.Cut(r, "/")
		if !ok || !isVersion(contract) {
			return "", "", false
		}
	}
	for _, t := range Types() {
		if u, _ := DataSchema(t); rest == strings.TrimPrefix(u, SchemaBaseURI) {
			return t, contract, true
		}
	}
	return "", "", false
}

// isVersion reports whether s is a contract version: a decimal number
// from 1, without leading zeros.
func isVersion(s string) bool {
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n > 0 && strconv.FormatUint(n, 10) == s
}
