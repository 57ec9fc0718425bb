// Package webauth guards the controller's HTTP listener (the dashboard, its JSON and
// /metrics) as kube-apiserver guards its own /metrics: a request passes only when the API
// server authenticates its bearer token (a TokenReview) and allows that user the request's
// verb on its path (a SubjectAccessReview of a non-resource URL, which the ClusterRole
// kuport-metrics-reader in deploy/rbac.yaml grants). Both answers are cached, so a scraper
// polling every few seconds costs the API server one review of each kind per TTL.
package webauth

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
)

const (
	// TokenTTL is how long a TokenReview's answer is reused for the same token. A rejection
	// that carries the API server's error (an invalid token's does) is not kept: the
	// library's cache keeps no errors.
	TokenTTL = time.Minute
	// AllowTTL is how long an allowing SubjectAccessReview is reused for the same user, verb
	// and path: a revoked binding takes effect within it.
	AllowTTL = time.Minute
	// DenyTTL is how long a denying SubjectAccessReview is reused: short, so a binding just
	// created takes effect soon.
	DenyTTL = 10 * time.Second
	// reviewTimeout bounds one review request to the API server.
	reviewTimeout = 10 * time.Second
)

// reviewBackoff retries a review the API server failed to answer, as kube-apiserver's
// aggregated servers retry their delegated reviews.
func reviewBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// Filter admits the requests the API server authenticates and authorizes; see the package
// comment. The client it is made with needs RBAC create on tokenreviews and
// subjectaccessreviews.
type Filter struct {
	authn authenticator.Request
	authz authorizer.Authorizer
	log   hclog.Logger
}

// New returns a Filter reviewing through kube, logging refusals at debug and failed reviews
// as warnings to log.
func New(kube kubernetes.Interface, log hclog.Logger) (*Filter, error) {
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		// No Anonymous: a request without a token is refused, not reviewed as system:anonymous.
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: reviewTimeout,
		WebhookRetryBackoff:      reviewBackoff(),
		CacheTTL:                 TokenTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("webauth: authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             AllowTTL,
		DenyCacheTTL:              DenyTTL,
		WebhookRetryBackoff:       reviewBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("webauth: authorizer: %w", err)
	}
	return &Filter{authn: authn, authz: authz, log: log}, nil
}

// Wrap returns next behind the filter: 401 without a token the API server accepts (as
// kube-apiserver answers, also when the review itself failed: the library logs that), 403
// when the API server does not allow the user the request, 500 when it could not be asked.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok, err := f.authn.AuthenticateRequest(r)
		if !ok {
			f.log.Debug("refused: not authenticated", "remote", r.RemoteAddr, "path", r.URL.Path, "error", err)
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unauthorized: present a bearer token the API server accepts", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{User: res.User, Verb: verb(r.Method), Path: r.URL.Path}
		decision, reason, err := f.authz.Authorize(r.Context(), attrs)
		if err != nil {
			f.log.Warn("subject access review failed", "user", res.User.GetName(), "path", r.URL.Path, "error", err)
			http.Error(w, "subject access review failed", http.StatusInternalServerError)
			return
		}
		if decision != authorizer.DecisionAllow {
			f.log.Debug("refused: not allowed", "user", res.User.GetName(), "verb", attrs.Verb, "path", r.URL.Path, "reason", reason)
			http.Error(w, fmt.Sprintf("forbidden: user %q may not %s %s", res.User.GetName(), attrs.Verb, r.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// verb is the RBAC verb of an HTTP method on a non-resource URL: its lower case, with HEAD
// asking for what GET would.
func verb(method string) string {
	if method == http.MethodHead {
		return "get"
	}
	return strings.ToLower(method)
}
