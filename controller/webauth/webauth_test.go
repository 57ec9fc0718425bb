package webauth

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	scraper   = "system:serviceaccount:monitoring:prometheus"
	bystander = "system:serviceaccount:default:default"
)

// apiServer answers TokenReviews and SubjectAccessReviews as kube-apiserver would with
// tokens "scraper" and "bystander" and the scraper bound to kuport-metrics-reader, and
// counts them. The delegating authenticator and authorizer post through the clientset's
// RESTClient, which client-go's fake clientset leaves nil, so the reviews need a server.
type apiServer struct {
	mu              sync.Mutex
	tokenReviews    int
	accessReviews   int
	lastAccessCheck authzv1.SubjectAccessReviewSpec
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
		a.tokenReviews++
		var review authnv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		users := map[string]string{"scraper": scraper, "bystander": bystander}
		if name, ok := users[review.Spec.Token]; ok {
			review.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: name}}
		} else {
			review.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		writeJSON(w, &review)
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		a.accessReviews++
		var review authzv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.lastAccessCheck = review.Spec
		nr := review.Spec.NonResourceAttributes
		review.Status.Allowed = review.Spec.User == scraper && nr != nil && nr.Verb == "get" &&
			(nr.Path == "/metrics" || nr.Path == "/state")
		writeJSON(w, &review)
	default:
		http.NotFound(w, r)
	}
}

func (a *apiServer) counts() (tokenReviews, accessReviews int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tokenReviews, a.accessReviews
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// newServer serves a handler answering "ok" behind a Filter reviewing with api.
func newServer(t *testing.T, api *apiServer) *httptest.Server {
	t.Helper()
	apiSrv := httptest.NewServer(api)
	t.Cleanup(apiSrv.Close)
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: apiSrv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(kube, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			t.Error("the bearer token reached the handler")
		}
		_, _ = io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	return srv
}

// get requests path with the Authorization header auth (none when empty) and returns the
// status and body.
func get(t *testing.T, srv *httptest.Server, method, path, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestFilter(t *testing.T) {
	api := &apiServer{}
	srv := newServer(t, api)
	for _, tc := range []struct {
		name, method, path, auth string
		want                     int
		// tokenReviews and accessReviews are how many reviews the API server has answered
		// after the request, from the start.
		tokenReviews, accessReviews int
	}{
		{name: "no token", method: "GET", path: "/metrics", want: http.StatusUnauthorized},
		{name: "not a bearer token", method: "GET", path: "/metrics", auth: "Basic c2NyYXBlcjo=", want: http.StatusUnauthorized},
		{name: "invalid token", method: "GET", path: "/metrics", auth: "Bearer forged", want: http.StatusUnauthorized, tokenReviews: 1},
		// The API server's answer to an invalid token carries an error, which the library's
		// cache does not keep.
		{name: "invalid token again", method: "GET", path: "/metrics", auth: "Bearer forged", want: http.StatusUnauthorized, tokenReviews: 2},
		{name: "denied", method: "GET", path: "/metrics", auth: "Bearer bystander", want: http.StatusForbidden, tokenReviews: 3, accessReviews: 1},
		{name: "denied, cached", method: "GET", path: "/metrics", auth: "Bearer bystander", want: http.StatusForbidden, tokenReviews: 3, accessReviews: 1},
		{name: "allowed", method: "GET", path: "/metrics", auth: "Bearer scraper", want: http.StatusOK, tokenReviews: 4, accessReviews: 2},
		{name: "allowed, cached", method: "GET", path: "/metrics", auth: "Bearer scraper", want: http.StatusOK, tokenReviews: 4, accessReviews: 2},
		{name: "HEAD asks for get, cached", method: "HEAD", path: "/metrics", auth: "Bearer scraper", want: http.StatusOK, tokenReviews: 4, accessReviews: 2},
		{name: "another path is another review", method: "GET", path: "/state", auth: "Bearer scraper", want: http.StatusOK, tokenReviews: 4, accessReviews: 3},
		{name: "a path the role does not grant", method: "GET", path: "/debug/pprof/", auth: "Bearer scraper", want: http.StatusForbidden, tokenReviews: 4, accessReviews: 4},
		{name: "another verb", method: "POST", path: "/metrics", auth: "Bearer scraper", want: http.StatusForbidden, tokenReviews: 4, accessReviews: 5},
	} {
		code, body := get(t, srv, tc.method, tc.path, tc.auth)
		if code != tc.want {
			t.Errorf("%s: %s %s: %d %q, want %d", tc.name, tc.method, tc.path, code, body, tc.want)
		}
		if code == http.StatusOK && tc.method == "GET" && body != "ok" {
			t.Errorf("%s: body %q, want the handler's", tc.name, body)
		}
		if tr, ar := api.counts(); tr != tc.tokenReviews || ar != tc.accessReviews {
			t.Errorf("%s: %d TokenReviews and %d SubjectAccessReviews, want %d and %d", tc.name, tr, ar, tc.tokenReviews, tc.accessReviews)
		}
	}
	api.mu.Lock()
	spec := api.lastAccessCheck
	api.mu.Unlock()
	if spec.User != scraper || spec.NonResourceAttributes == nil || spec.ResourceAttributes != nil ||
		*spec.NonResourceAttributes != (authzv1.NonResourceAttributes{Path: "/metrics", Verb: "post"}) {
		t.Errorf("last SubjectAccessReview %+v: want the scraper's post on the non-resource URL /metrics", spec)
	}
}

// TestFilterScrapeCost is the API server's cost of a scraper within the TTLs: one review of
// each kind, however often it scrapes.
func TestFilterScrapeCost(t *testing.T) {
	api := &apiServer{}
	srv := newServer(t, api)
	const scrapes = 100
	for range scrapes {
		if code, body := get(t, srv, "GET", "/metrics", "Bearer scraper"); code != http.StatusOK {
			t.Fatalf("scrape: %d %q", code, body)
		}
	}
	if tr, ar := api.counts(); tr != 1 || ar != 1 {
		t.Errorf("%d scrapes made %d TokenReviews and %d SubjectAccessReviews, want 1 and 1", scrapes, tr, ar)
	}
}
