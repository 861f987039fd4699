package gateway

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/ringlimit/ringlimit/internal/identity"
)

// ErrUnauthorized is wrapped by every error about a presented token that
// fails verification; the gateway answers it 401 and spends nothing.
var ErrUnauthorized = errors.New("gateway: unauthorized")

// ErrAmbiguous: a request that names its client twice (two Authorization
// headers while JWTs are verified, two API key headers). The gateway
// keys on one value while the upstream may read the other, so a client
// could spend another's budget, or a made-up one, and act as itself.
var ErrAmbiguous = errors.New("gateway: ambiguous client identity")

// JWTKeys verifies the tokens of Authorization: Bearer headers: an HS256
// secret, an RSA or ECDSA public key, or a JWKS (keys chosen by kid).
// Create one with ParseJWTKeys. It is immutable and safe for concurrent use.
type JWTKeys struct {
	methods []string
	keyfunc jwt.Keyfunc
}

// ParseJWTKeys reads what --jwt-key names: a JWKS document (JSON with a
// "keys" list: RSA and EC public keys, RS256/ES256 and their larger
// variants), a PEM public key or certificate (RSA: RS256/384/512, EC:
// ES256/384/512), or else an HS256 secret of at least 32 bytes (a
// trailing newline is ignored). alg "none" is never accepted.
func ParseJWTKeys(data []byte) (*JWTKeys, error) {
	trimmed := bytes.TrimSpace(data)
	switch {
	case bytes.HasPrefix(trimmed, []byte("{")):
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(trimmed, &set); err != nil {
			return nil, fmt.Errorf("gateway: JWKS: %w", err)
		}
		if len(set.Keys) == 0 {
			return nil, errors.New("gateway: JWKS has no keys")
		}
		byKid := map[string]crypto.PublicKey{}
		for i, k := range set.Keys {
			if !k.IsPublic() {
				return nil, fmt.Errorf("gateway: JWKS key %d (kid %q) is not a public key", i, k.KeyID)
			}
			switch k.Key.(type) {
			case *rsa.PublicKey, *ecdsa.PublicKey:
			default:
				return nil, fmt.Errorf("gateway: JWKS key %d (kid %q): want an RSA or EC public key, got %T", i, k.KeyID, k.Key)
			}
			byKid[k.KeyID] = k.Key
		}
		return &JWTKeys{methods: []string{"RS256", "RS384", "RS512", "ES256", "ES384", "ES512"}, keyfunc: func(t *jwt.Token) (any, error) {
			kid, _ := t.Header["kid"].(string)
			k, ok := byKid[kid]
			if !ok && kid == "" && len(byKid) == 1 {
				for _, only := range byKid {
					return only, nil
				}
			}
			if !ok {
				return nil, fmt.Errorf("no key with kid %q", kid)
			}
			return k, nil
		}}, nil
	case bytes.HasPrefix(trimmed, []byte("-----BEGIN")):
		if k, err := jwt.ParseRSAPublicKeyFromPEM(trimmed); err == nil {
			return fixedKey(k, "RS256", "RS384", "RS512"), nil
		}
		if k, err := jwt.ParseECPublicKeyFromPEM(trimmed); err == nil {
			return fixedKey(k, "ES256", "ES384", "ES512"), nil
		}
		return nil, errors.New("gateway: PEM holds neither an RSA nor an EC public key (nor a certificate of one)")
	}
	secret := bytes.TrimSuffix(bytes.TrimSuffix(data, []byte("\n")), []byte("\r"))
	if len(secret) < 32 {
		return nil, fmt.Errorf("gateway: HS256 secret of %d bytes; want at least 32 (or a PEM key, or a JWKS)", len(secret))
	}
	return fixedKey(secret, "HS256"), nil
}

func fixedKey(k any, methods ...string) *JWTKeys {
	return &JWTKeys{methods: methods, keyfunc: func(*jwt.Token) (any, error) { return k, nil }}
}

// verify returns the claims of a valid token at now, or an error wrapping
// ErrUnauthorized: bad signature, wrong key, algorithm not the key's
// (alg none included), expired, not yet valid, malformed; and, when
// audience is not "", an aud claim (a string or a list) without it, or
// none; when issuer is not "", an iss claim other than it, or none.
func (k *JWTKeys) verify(token string, now time.Time, audience, issuer string) (jwt.MapClaims, error) {
	opts := []jwt.ParserOption{jwt.WithValidMethods(k.methods), jwt.WithTimeFunc(func() time.Time { return now }), jwt.WithLeeway(jwtLeeway)}
	// Only when set: jwt.WithAudience("") would require an aud of "".
	if audience != "" {
		opts = append(opts, jwt.WithAudience(audience))
	}
	if issuer != "" {
		opts = append(opts, jwt.WithIssuer(issuer))
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(token, claims, k.keyfunc, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	return claims, nil
}

// jwtLeeway is how far a token's exp, nbf and iat may be off the
// gateway's clock: an issuer whose clock is a second or two ahead (iat,
// nbf) made every fresh token 401 for that long. Spring Security allows
// 60 s; the gateway, half.
const jwtLeeway = 30 * time.Second

// Identity says how the gateway tells clients apart, in order of trust:
// the claim of a verified JWT, the API-key header, the client's IP.
type Identity struct {
	// JWT verifies bearer tokens; nil = tokens are not looked at.
	JWT *JWTKeys
	// Audience, when not "", must be in a verified token's aud claim (a
	// string or a list of them); a token without it fails verification
	// (ErrUnauthorized). "" = aud is not checked. Used only with JWT.
	Audience string
	// Issuer, when not "", must equal a verified token's iss claim; a
	// token with another issuer, or none, fails verification
	// (ErrUnauthorized). "" = iss is not checked. Used only with JWT.
	Issuer string
	// Claim names the client id claim (default "sub"); TierClaim the
	// claim holding the client's tier ("" = no tiers from tokens).
	Claim, TierClaim string
	// APIKeyHeader names the header whose value identifies the client;
	// "" = none.
	APIKeyHeader string
	// TrustedProxies are the networks whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// IPv6Prefix is how many leading bits of an IPv6 client address key
	// it (ipKey): 0 is DefaultIPv6Prefix, 128 the whole address.
	IPv6Prefix int
}

// DefaultIPv6Prefix is the IPv6 prefix length a client is keyed by
// (Identity.IPv6Prefix): a /64, what one subscriber's network is given
// (RFC 6177) and what its hosts pick their addresses in at will
// (privacy addresses, RFC 8981).
const DefaultIPv6Prefix = 64

// ParseCIDRs reads a comma-separated list of CIDRs or single addresses.
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("gateway: trusted proxy %q: %w", f, err)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("gateway: trusted proxy %q: %w", f, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// caller is who a request comes from.
type caller struct {
	key  string // "sub:ID", "key:VALUE", "subh:/keyh:SHA256" (see identity.Key) or "ip:ADDR": the kinds never collide
	tier string
}

// identify returns who sent r. A bearer token that is presented while
// JWT is set must verify, else the error wraps ErrUnauthorized; an
// identity header given twice is an error wrapping ErrAmbiguous.
func (id *Identity) identify(r *http.Request, now time.Time) (caller, error) {
	for _, h := range []string{"Authorization", id.APIKeyHeader} {
		if h != "" && (h != "Authorization" || id.JWT != nil) && len(r.Header.Values(h)) > 1 {
			return caller{}, fmt.Errorf("%w: %d %s headers", ErrAmbiguous, len(r.Header.Values(h)), http.CanonicalHeaderKey(h))
		}
	}
	if id.JWT != nil {
		if tok, ok := bearer(r.Header.Get("Authorization")); ok {
			if tok == "" {
				return caller{}, fmt.Errorf("%w: Bearer with no token", ErrUnauthorized)
			}
			claims, err := id.JWT.verify(tok, now, id.Audience, id.Issuer)
			if err != nil {
				return caller{}, err
			}
			claim := id.Claim
			if claim == "" {
				claim = "sub"
			}
			sub := claimString(claims[claim])
			if sub == "" {
				return caller{}, fmt.Errorf("%w: token has no string or integer claim %q", ErrUnauthorized, claim)
			}
			c := caller{key: identity.Key("sub", sub)}
			if id.TierClaim != "" {
				c.tier, _ = claims[id.TierClaim].(string)
			}
			return c, nil
		}
	}
	if id.APIKeyHeader != "" {
		if v := apiKey(r.Header.Get(id.APIKeyHeader)); v != "" {
			return caller{key: identity.Key("key", v)}, nil
		}
	}
	return caller{key: id.ipKey(r)}, nil
}

// claimString is a JWT claim's value as a client id: a string as it is,
// an integer (a JSON number without a fraction: Django REST's SimpleJWT
// writes user_id so) in decimal, "" for anything else. Was: strings
// only, and every token of such an issuer was refused (401).
func claimString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return strconv.FormatInt(int64(v), 10)
		}
	}
	return ""
}

// apiKey is the client's key in an API-key header's value v: v, or the
// credentials alone when v is "Bearer" or "Token" (any case), then
// spaces or tabs, then one token, as OAuth's and Rails' token parsers
// read it. Was: v as sent, so with --api-key-header Authorization
// (OpenAI-style keys) "Bearer sk-1", "bearer sk-1", "Bearer  sk-1" and
// "Token sk-1" were four clients with four budgets, one key to the
// upstream (a helper attacking the gateway: 8 spellings, 8 passed a
// limit of 1).
func apiKey(v string) string {
	if f := strings.Fields(v); len(f) == 2 && (strings.EqualFold(f[0], "bearer") || strings.EqualFold(f[0], "token")) {
		return f[1]
	}
	return v
}

// ipKey is r's client IP as a key, "ip:ADDR": the last link of the
// identity chain, and what a route limit with key: ip is keyed by. An
// IPv6 client is keyed by its network, "ip:PREFIX/BITS" (IPv6Prefix
// bits, 64 by default): every host of a /64 picks its addresses in it at
// will, and keyed by the whole address a client that changed address
// per request had a fresh budget each time (a helper attacking the
// gateway: 5 of 5 logins through a limit of 1 per IP).
func (id *Identity) ipKey(r *http.Request) string {
	ip := embeddedIPv4(id.clientIP(r))
	bits := id.IPv6Prefix
	if bits == 0 {
		bits = DefaultIPv6Prefix
	}
	if ip.Is6() && bits < 128 {
		if p, err := ip.Prefix(bits); err == nil {
			return "ip:" + p.String()
		}
	}
	return "ip:" + ip.String()
}

// bearer returns the token of an Authorization header of the Bearer
// scheme (case-insensitive) and true; false for another scheme. RFC
// 9110 (11.4) puts 1*SP between scheme and token; any run of spaces and
// tabs is taken here, and a Bearer header with no token gives "" and
// true, which identify refuses. Was: "Bearer<TAB>token" and "Bearer"
// alone were "no token", so the client was keyed by its API key or IP
// while an upstream that splits on whitespace took it as the token's
// subject: a made-up API key per request escaped that subject's limit.
func bearer(v string) (string, bool) {
	const scheme = "bearer"
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	rest := v[len(scheme):]
	if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
		return "", false // another scheme ("Bearerx")
	}
	return strings.Trim(rest, " \t"), true
}

// nat64 is the well-known NAT64 prefix (RFC 6052): 64:ff9b::a.b.c.d is
// IPv4 client a.b.c.d translated. sixToFour is 6to4's (RFC 3056): a
// 2002:AABB:CCDD::/48 is IPv4 host AA.BB.CC.DD's.
var nat64, sixToFour = netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("2002::/16")

// embeddedIPv4 is the IPv4 address ip stands for when it is a NAT64 or
// 6to4 address, else ip. Was: keyed by its /64, so behind a NAT64
// every IPv4 client shared one budget, and one 6to4 host had 65,536
// (a helper attacking the gateway).
func embeddedIPv4(ip netip.Addr) netip.Addr {
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		return netip.AddrFrom4([4]byte(b[12:16]))
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6]))
	}
	return ip
}

// clientIP is the peer's address, or — when the peer is a trusted proxy
// — the right-most address of X-Forwarded-For that is not a trusted
// proxy (every hop left of it could have been written by the client).
func (id *Identity) clientIP(r *http.Request) netip.Addr {
	ip := peerIP(r)
	if !id.trusted(ip) {
		return ip
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		parts := strings.Split(hops[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			a, ok := parseHop(parts[j])
			if !ok {
				return ip // garbage: the last address we could trust
			}
			ip = a
			if !id.trusted(ip) {
				return ip
			}
		}
	}
	return ip
}

// peerIP is the address of the request's peer (0.0.0.0 when unknown).
func peerIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.IPv4Unspecified()
	}
	return ip.Unmap()
}

// forwardingHeaders are the headers that tell an upstream where a
// request came from, canonical.
var forwardingHeaders = [...]string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip"}

// forwarding makes what r's headers tell the upstream of its origin
// what the gateway knows. From a peer that is not a trusted proxy, the
// forwarding headers it wrote are dropped, and the headers that spell
// them or the API-key header with underscores for dashes (CGI, WSGI and
// Rack read X_Forwarded_Host as X-Forwarded-Host); X-Forwarded-Host and X-Forwarded-Proto are
// then the gateway's, and the reverse proxy starts X-Forwarded-For at
// the peer. A trusted proxy's are kept (X-Forwarded-For appended to).
// Was: passed as the client wrote them, none of the gateway's own.
func (id *Identity) forwarding(r *http.Request) {
	h := r.Header
	if !id.trusted(peerIP(r)) {
		for _, k := range forwardingHeaders {
			delete(h, k)
		}
		for k := range h {
			if d := dashed(k); d != "" && (slices.Contains(forwardingHeaders[:], d) || id.APIKeyHeader != "" && strings.EqualFold(d, id.APIKeyHeader)) {
				delete(h, k)
			}
		}
	}
	if h.Get("X-Forwarded-Host") == "" {
		h.Set("X-Forwarded-Host", r.Host)
	}
	if h.Get("X-Forwarded-Proto") == "" {
		proto := "http"
		if r.TLS != nil {
			proto = "https"
		}
		h.Set("X-Forwarded-Proto", proto)
	}
}

// dashed is the header a key spelled with underscores for dashes stands
// for to an upstream that reads it so (CGI, WSGI and Rack: X_Api_Key as
// X-Api-Key), canonical; "" for a key with no underscore.
func dashed(k string) string {
	if !strings.Contains(k, "_") {
		return ""
	}
	return textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(k, "_", "-"))
}

// parseHop reads one X-Forwarded-For entry: an address, or an address
// and port ("1.2.3.4:80", "[2001:db8::1]:443", as some proxies write
// them), IPv4-mapped addresses as IPv4 and without an IPv6 zone
// ("%eth0" names an interface of the proxy, not the client). Was: the
// forms with a port were garbage, so every client behind such a proxy
// was keyed by the proxy's address and shared one budget; and a zone
// was kept in the key, one budget per zone the client wrote.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		// "[v6]:port", "[v6]" or "v4:port": never a bare IPv6 address,
		// which ParseAddr read.
		host, _, serr := net.SplitHostPort(s)
		if serr != nil {
			host = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
			if host == s {
				return netip.Addr{}, false
			}
		}
		if a, err = netip.ParseAddr(host); err != nil {
			return netip.Addr{}, false
		}
	}
	return a.WithZone("").Unmap(), true
}

func (id *Identity) trusted(ip netip.Addr) bool {
	for _, p := range id.TrustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
