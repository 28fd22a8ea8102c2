// Package transport carries every gpuctl connection: one UDP port speaking
// QUIC with mutual TLS, the cluster certificate authority that issues the
// certificates, join tokens that trade for a node certificate, typed
// streams, and the reconnect backoff nodemon uses around its dial.
//
// # Roles and ALPNs
//
// The server listens on one UDP port for three application protocols:
//
//   - gpuctl-node/1: nodemon sessions; the client certificate must be a node
//     certificate issued by this cluster's CA.
//   - gpuctl-client/1: gpuctl clients; the client certificate must carry a
//     client role (viewer, operator or admin).
//   - gpuctl-join/1: a node without a certificate yet trades a join token for
//     one. Only the server authenticates; the node pins the server's CA with
//     the hash carried in the token.
//
// A certificate's role is its Subject's OrganizationalUnit and its name the
// CommonName. Peers are verified right after the handshake and a refused peer
// is closed with CodeRefused and a message that says why.
//
// # Join tokens
//
// A join token is stateless and reads
//
//	gpj1.<id>.<expiry>.<mac>.<cahash>
//
// where id is 16 lowercase hex digits (random), expiry the Unix time in
// seconds after which the token is refused, mac the unpadded base64url
// HMAC-SHA256 of "gpj1.<id>.<expiry>.<cahash>" under the secret in the data
// dir's join.secret, and cahash the lowercase hex SHA-256 of the cluster CA
// certificate's DER bytes (the value `openssl x509 -noout -fingerprint
// -sha256 -in ca.crt` prints, without colons). The joining node uses cahash
// to authenticate the server before it holds the CA.
//
// The signature makes a token hard to forge; the server's record of it (a
// TokenLedger: the store under gpuctl serve) makes it single-use unless
// created for more joins, and revocable one by one. A token the server has
// no record of is refused. RevokeTokens replaces the secret, which
// invalidates every token issued so far.
//
// # Revocation
//
// Every node and client certificate is checked at each connection against
// ListenConfig.CheckPeer, where the server consults its deny-list of
// revoked serial numbers; Listener.Disconnect closes the connections a
// revocation catches while they are open.
package transport
