// Package natsauth gives each node's bridge its own NATS identity, in
// operator (JWT) mode, so that a node can publish events only under its own
// name: <prefix>.<node token>.> and its own keys of the state bucket; and
// gives readers identities limited to Kubernetes namespaces.
//
// The account that holds the stream has a scoped signing key: a key whose
// users carry no permissions of their own, and get the key's permission
// template (NodeTemplate) instead, with {{name()}} replaced by the user's
// name. Mint issues a node's user with that key, named by the node's subject
// token, and returns the node's credentials file. The account's operator
// sets the key up once; after that, a node's credentials come from the key's
// seed and the node's name alone, with no change to the account or the
// server.
//
// Readers work the same way with a second scoped key (ReaderRole,
// ReaderTemplate): MintReader tags the user with its namespaces (and the
// durable groups whose work streams it may consume), and the template
// expands {{tag(namespace)}} into one consumer filter per namespace.
//
// NewAccount makes the whole set-up without nsc: an operator, a system
// account and the account with both scoped keys, as JWTs, and the part of
// a nats-server configuration that trusts and resolves them
// (Account.ServerConfig); pleg-bridge creds --init writes it out.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// natsauth imports schemas, consumer (to validate namespace names),
// nats-io/jwt and nats-io/nkeys only. The pleg-bridge creds command, the
// bridge (to know a node's own credentials) and the tests (directly or
// through natsauthtest) use it; nothing else imports it.
package natsauth
