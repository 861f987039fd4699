package rls

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	yaml "go.yaml.in/yaml/v2"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/rules"
)

// Bounds on configuration, checked before anything is allocated for it.
const (
	// MaxFileSize is the largest config file read, in bytes.
	MaxFileSize = 1 << 20
	// MaxFiles is the most config files in a directory.
	MaxFiles = 256
	// MaxDepth is the deepest nesting of descriptors in a config file,
	// and the most entries of a request descriptor that can match.
	MaxDepth = 16
	// MaxLimits is the most descriptor limits of a whole config.
	MaxLimits = 100_000
	// MaxRateLimits is the most rate_limits of one descriptor.
	MaxRateLimits = 8
)

// ErrConfig is wrapped by every error about a config file.
var ErrConfig = errors.New("rls: invalid config")

// ConfigError says what is wrong with a config file, and where. Its
// message reads
//
//	rls config /etc/rl/messaging.yaml: domain "messaging": descriptor "message_type_marketing.to_number": rate_limit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)
type ConfigError struct {
	File       string
	Domain     string // "" when the file has none (yet)
	Descriptor string // the descriptor's path as envoyproxy/ratelimit writes it (key_value.key2), "" for the file as a whole
	Msg        string
}

func (e *ConfigError) Error() string {
	s := "rls config " + e.File + ": "
	if e.Domain != "" {
		s += "domain " + strconv.Quote(e.Domain) + ": "
	}
	if e.Descriptor != "" {
		s += "descriptor " + strconv.Quote(e.Descriptor) + ": "
	}
	return s + e.Msg
}

// Unwrap returns ErrConfig.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// The YAML form: envoyproxy/ratelimit's, plus ringlimit's extra fields
// (rate_limits; algorithm, burst and failure_mode in a rate limit), which
// its tooling never sees. Unknown fields are refused, as theirs are. It
// is decoded as theirs is, by a yaml.v2 decoder straight into these
// fields, so a scalar read into a string field keeps its text as
// written: `value: yes`, `value: 010` and `domain: y` are the strings
// "yes", "010" and "y" (a decoder through JSON made them true, 8 and
// "true", and such limits never matched).
type yamlFile struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	RateLimits     []yamlRateLimit  `yaml:"rate_limits"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
}

type yamlRateLimit struct {
	Unit            string        `yaml:"unit"`
	RequestsPerUnit uint32        `yaml:"requests_per_unit"`
	Unlimited       bool          `yaml:"unlimited"`
	Name            string        `yaml:"name"`
	Replaces        []yamlReplace `yaml:"replaces"`
	Algorithm       string        `yaml:"algorithm"`
	Burst           int64         `yaml:"burst"`
	FailureMode     string        `yaml:"failure_mode"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

// Config is a loaded, validated set of domains. It is immutable and safe
// for concurrent use.
type Config struct {
	domains map[string]*level
	limits  int
	empty   []string // the domains that limit nothing (EmptyDomains)
}

// Domains returns the number of domains.
func (c *Config) Domains() int { return len(c.domains) }

// Limits returns the number of descriptors with a rate_limit.
func (c *Config) Limits() int { return c.limits }

// EmptyDomains returns, sorted, the domains with no rate_limit in any
// of their descriptors: every call of theirs is answered OK.
func (c *Config) EmptyDomains() []string {
	return slices.Sorted(slices.Values(c.empty))
}

// level is one list of descriptors: by (key, value), by key alone (no
// value: any value, each its own counter), and by value prefix (a value
// ending in '*'), tried in that order as envoyproxy/ratelimit does.
type level struct {
	exact    map[entry]*descNode
	anyValue map[string]*descNode
	prefix   []prefixNode // in file order
}

type entry struct{ key, value string }

type prefixNode struct {
	key, prefix string
	node        *descNode
}

type descNode struct {
	limit    *limit // nil: no rate_limit here
	children *level // nil: no nested descriptors
}

// limit is a descriptor's rate_limit (or rate_limits): what a request
// descriptor that ends on it is held to.
type limit struct {
	fullKey   string // domain.key_value.key2: the metrics key
	rules     []*limiter.Rule
	units     []rlspb.RateLimitResponse_RateLimit_Unit
	unlimited bool // rate_limit: {unlimited: true}
	denyAll   bool // requests_per_unit: 0 (blocks everything, as theirs)
	shadow    bool
	detailed  bool     // detailed_metric: the value joins the metrics key
	names     []string // the rate limits' names, for replaces
	rlNames   []string // per rule: its rate limit's name, "" when none
	replaces  []string

	// multiplier is a descriptor limit override's unit_multiplier, 0 or 1
	// for none: a deny-all limit's window is its unit times it.
	multiplier uint32
}

// Unit lengths. Month and year are 30 and 365 days (windows aligned to
// the Unix epoch, not to the calendar).
var units = map[string]struct {
	d time.Duration
	u rlspb.RateLimitResponse_RateLimit_Unit
}{
	"second": {time.Second, rlspb.RateLimitResponse_RateLimit_SECOND},
	"minute": {time.Minute, rlspb.RateLimitResponse_RateLimit_MINUTE},
	"hour":   {time.Hour, rlspb.RateLimitResponse_RateLimit_HOUR},
	"day":    {24 * time.Hour, rlspb.RateLimitResponse_RateLimit_DAY},
	"week":   {7 * 24 * time.Hour, rlspb.RateLimitResponse_RateLimit_WEEK},
	"month":  {30 * 24 * time.Hour, rlspb.RateLimitResponse_RateLimit_MONTH},
	"year":   {365 * 24 * time.Hour, rlspb.RateLimitResponse_RateLimit_YEAR},
}

// File is one config file's name and content.
type File struct {
	Name string
	Data []byte
}

// ParseConfig validates and compiles config files into one Config. A
// domain may appear in one file only. Its error is a *ConfigError naming
// the file, domain and descriptor at fault.
func ParseConfig(files ...File) (*Config, error) {
	if len(files) > MaxFiles {
		return nil, &ConfigError{File: files[0].Name, Msg: fmt.Sprintf("%d files, over the limit of %d", len(files), MaxFiles)}
	}
	c := &Config{domains: map[string]*level{}}
	from := map[string]string{} // domain → file
	for _, f := range files {
		if len(f.Data) > MaxFileSize {
			return nil, &ConfigError{File: f.Name, Msg: fmt.Sprintf("%d bytes, over the limit of %d", len(f.Data), MaxFileSize)}
		}
		var y yamlFile
		if err := yaml.UnmarshalStrict(f.Data, &y); err != nil {
			var loose yamlFile // name the domain when the file has one
			_ = yaml.Unmarshal(f.Data, &loose)
			return nil, &ConfigError{File: f.Name, Domain: loose.Domain, Msg: yamlMessage(err)}
		}
		if y.Domain == "" {
			return nil, &ConfigError{File: f.Name, Msg: "domain: missing; every config file needs a domain"}
		}
		if other, dup := from[y.Domain]; dup {
			return nil, &ConfigError{File: f.Name, Domain: y.Domain, Msg: "duplicate domain (also in " + other + ")"}
		}
		from[y.Domain] = f.Name
		b := builder{c: c, file: f.Name, domain: y.Domain, paths: map[string]bool{}}
		before := c.limits
		lv, err := b.level(y.Descriptors, "", 1)
		if err != nil {
			return nil, err
		}
		c.domains[y.Domain] = lv
		if c.limits == before {
			c.empty = append(c.empty, y.Domain)
		}
	}
	return c, nil
}

// yamlMessage is the YAML decoder's error in the config's own terms: a
// field it does not know, or a value of the wrong type, by line, without
// the Go types it was decoded into.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if f, ok := strings.CutPrefix(m[strings.Index(m, ": ")+2:], "field "); ok && strings.Contains(f, " not found in type ") {
			m = m[:strings.Index(m, ": ")+2] + fmt.Sprintf("unknown field %q", f[:strings.Index(f, " not found in type ")])
		}
		for goType, want := range yamlTypeNames {
			m = strings.ReplaceAll(m, " into "+goType, " into "+want)
		}
		msgs[i] = m
	}
	return strings.Join(msgs, "; ")
}

// yamlTypeNames names the Go types of the YAML form's fields for errors.
var yamlTypeNames = map[string]string{
	"uint32":               "a whole number from 0 to 4294967295",
	"int64":                "a whole number",
	"bool":                 "true or false",
	"string":               "a string",
	"[]rls.yamlDescriptor": "a list of descriptors",
	"[]rls.yamlRateLimit":  "a list of rate limits",
	"[]rls.yamlReplace":    "a list of {name: ...}",
	"rls.yamlRateLimit":    "a rate limit",
	"rls.yamlDescriptor":   "a descriptor",
	"rls.yamlReplace":      "{name: ...}",
	"rls.yamlFile":         "a config file (domain, descriptors)",
}

type builder struct {
	c            *Config
	file, domain string
	// paths holds the descriptor paths seen in the domain: a path names
	// its limits' rules (ruleName), so two descriptors of one path (key
	// "a_b", and key "a" with value "b") would share rule names.
	paths map[string]bool
}

// overridePrefix begins the path of a descriptor limit override's rule
// (overrideRuleName): reserved, so that no configured descriptor names
// the same rule.
const overridePrefix = "_override_"

func (b *builder) fail(path, format string, a ...any) error {
	return &ConfigError{File: b.file, Domain: b.domain, Descriptor: path, Msg: fmt.Sprintf(format, a...)}
}

func (b *builder) level(ds []yamlDescriptor, parent string, depth int) (*level, error) {
	if depth > MaxDepth {
		return nil, b.fail(parent, "descriptors nested deeper than %d", MaxDepth)
	}
	lv := &level{exact: map[entry]*descNode{}, anyValue: map[string]*descNode{}}
	for i, d := range ds {
		path := d.Key
		if d.Value != "" {
			path += "_" + d.Value
		}
		if parent != "" {
			path = parent + "." + path
		}
		if d.Key == "" {
			return nil, b.fail(parent, "descriptors[%d]: key: missing; every descriptor needs a key", i)
		}
		if parent == "" && strings.HasPrefix(path, overridePrefix) {
			return nil, b.fail(path, "descriptor keys beginning with %q are reserved for descriptor limit overrides (their rules' names)", overridePrefix)
		}
		n := &descNode{}
		switch {
		case d.Value == "":
			if lv.anyValue[d.Key] != nil {
				return nil, b.fail(path, "duplicate descriptor")
			}
			lv.anyValue[d.Key] = n
		case strings.HasSuffix(d.Value, "*"):
			p := strings.TrimSuffix(d.Value, "*")
			if slices.ContainsFunc(lv.prefix, func(pn prefixNode) bool { return pn.key == d.Key && pn.prefix == p }) {
				return nil, b.fail(path, "duplicate descriptor")
			}
			lv.prefix = append(lv.prefix, prefixNode{d.Key, p, n})
		default:
			e := entry{d.Key, d.Value}
			if lv.exact[e] != nil {
				return nil, b.fail(path, "duplicate descriptor")
			}
			lv.exact[e] = n
		}
		// Not a duplicate, yet of a path seen: two descriptors compose
		// one ("a_b" alone and "a" with value "b", "x.y" and x's child y).
		if b.paths[path] {
			return nil, b.fail(path, "another descriptor of this domain has the same path (key, _value, joined by dots): their limits would share rule names; rename one key")
		}
		b.paths[path] = true
		l, err := b.limit(&d, path)
		if err != nil {
			return nil, err
		}
		n.limit = l
		if len(d.Descriptors) > 0 {
			if n.children, err = b.level(d.Descriptors, path, depth+1); err != nil {
				return nil, err
			}
		}
	}
	return lv, nil
}

// limit compiles a descriptor's rate_limit or rate_limits; nil when it
// has neither.
func (b *builder) limit(d *yamlDescriptor, path string) (*limit, error) {
	blocks := d.RateLimits
	switch {
	case d.RateLimit != nil && len(d.RateLimits) > 0:
		return nil, b.fail(path, "rate_limit and rate_limits: give one or the other")
	case d.RateLimit != nil:
		blocks = []yamlRateLimit{*d.RateLimit}
	case len(blocks) == 0:
		return nil, nil // shadow_mode without a limit means nothing, as theirs
	case len(blocks) > MaxRateLimits:
		return nil, b.fail(path, "rate_limits: %d limits, at most %d", len(blocks), MaxRateLimits)
	}
	if b.c.limits++; b.c.limits > MaxLimits {
		return nil, b.fail(path, "more than %d limits in the config", MaxLimits)
	}
	l := &limit{fullKey: b.domain + "." + path, shadow: d.ShadowMode, detailed: d.DetailedMetric}
	field := "rate_limit"
	for i, rl := range blocks {
		if len(d.RateLimits) > 0 {
			field = fmt.Sprintf("rate_limits[%d]", i)
		}
		if rl.Name != "" {
			l.names = append(l.names, rl.Name)
		}
		for _, r := range rl.Replaces {
			switch {
			case r.Name == "":
				return nil, b.fail(path, "%s: replaces: an entry without a name", field)
			case r.Name == rl.Name:
				return nil, b.fail(path, "%s: replaces: names its own limit %q", field, r.Name)
			}
			l.replaces = append(l.replaces, r.Name)
		}
		if rl.Unlimited {
			if rl.Unit != "" || rl.RequestsPerUnit != 0 || rl.Algorithm != "" || rl.Burst != 0 || len(blocks) > 1 {
				return nil, b.fail(path, "%s: unlimited: takes no unit, requests_per_unit, algorithm, burst or other rate limits", field)
			}
			l.unlimited = true
			continue
		}
		u, ok := units[strings.ToLower(rl.Unit)]
		if !ok {
			return nil, b.fail(path, "%s: unit: invalid unit %q (want second, minute, hour, day, week, month or year)", field, rl.Unit)
		}
		if rl.RequestsPerUnit == 0 {
			if len(blocks) > 1 || rl.Algorithm != "" || rl.Burst != 0 {
				return nil, b.fail(path, "%s: requests_per_unit: 0 blocks everything; it takes no algorithm, burst or other rate limits", field)
			}
			l.denyAll = true
			l.units = append(l.units, u.u)
			continue
		}
		algo := limiter.FixedWindow
		if rl.Algorithm != "" {
			var err error
			if algo, err = limiter.ParseAlgorithm(rl.Algorithm); err != nil {
				return nil, b.fail(path, "%s: algorithm: %v", field, err)
			}
		}
		fm, err := limiter.ParseFailureMode(rl.FailureMode)
		if err != nil {
			return nil, b.fail(path, "%s: failure_mode: %v", field, err)
		}
		r := &limiter.Rule{
			Name: ruleName(b.domain, path, i), Algorithm: algo, FailureMode: fm,
			Limit: int64(rl.RequestsPerUnit), Period: u.d, Burst: rl.Burst,
		}
		if err := r.Validate(); err != nil {
			var fe *limiter.FieldError
			if errors.As(err, &fe) {
				return nil, b.fail(path, "%s: %s: %s", field, yamlField(fe.Field), fe.Msg)
			}
			return nil, b.fail(path, "%s: %v", field, err)
		}
		l.rules = append(l.rules, r)
		l.units = append(l.units, u.u)
		l.rlNames = append(l.rlNames, rl.Name)
	}
	return l, nil
}

// yamlField maps a limiter field to the config's word for it.
func yamlField(f string) string {
	switch f {
	case "limit":
		return "requests_per_unit"
	case "period":
		return "unit"
	}
	return f
}

// ruleName names the i-th rate limit of a descriptor: the same in every
// process that loads the same config, so their checks share buckets on
// the owner, and never the name of a written rule (rules.InlinePrefix).
// It reads rls:DOMAIN/PATH#I when that is a valid rule name free of the
// separators, else rls:h + a hash of the same parts.
func ruleName(domain, path string, i int) string {
	name := rules.InlinePrefix + domain + "/" + path + "#" + strconv.Itoa(i)
	if limiter.ValidName(name) && !strings.ContainsAny(domain, "/#") && !strings.Contains(path, "#") {
		return name
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range []string{domain, path} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	return rules.InlinePrefix + "h" + hex.EncodeToString(h.Sum(nil)[:16]) + "#" + strconv.Itoa(i)
}

// match finds the limit of one request descriptor in a domain, as
// envoyproxy/ratelimit does: at each level the entry's (key, value), then
// a value prefix, then the key alone; a limit counts only when it is
// reached on the descriptor's last entry.
func (lv *level) match(entries []*commonpb.RateLimitDescriptor_Entry) *limit {
	var found *limit
	for i, pe := range entries {
		e := entry{pe.GetKey(), pe.GetValue()}
		n := lv.exact[e]
		if n == nil {
			for _, p := range lv.prefix {
				if p.key == e.key && strings.HasPrefix(e.value, p.prefix) {
					n = p.node
					break
				}
			}
		}
		if n == nil {
			n = lv.anyValue[e.key]
		}
		if n == nil {
			return nil
		}
		if n.limit != nil && i == len(entries)-1 {
			found = n.limit
		}
		if n.children == nil {
			break
		}
		lv = n.children
	}
	return found
}
