package agents

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
)

const (
	// TokenAudience is the audience of agent tokens: the controller accepts no other, so a
	// token meant for the API server (or anything else) is no identity towards it.
	TokenAudience = "kuport"
	// DefaultAgentServiceAccount is the agents' ServiceAccount, "<namespace>:<name>"
	// (deploy/rbac.yaml).
	DefaultAgentServiceAccount = "kuport-system:kuport-agent"
)

// Identity is what an agent's token proves: the Pod it is bound to and that Pod's node.
type Identity struct {
	// Node is the name of the node the bound Pod runs on.
	Node string
	// Pod is the bound Pod, "<namespace>/<name>".
	Pod string
}

// Authenticator tells which node an agent token was issued for. Its errors are gRPC status
// errors: UNAUTHENTICATED for a token that proves nothing, PERMISSION_DENIED for a valid
// token of someone other than an agent, UNAVAILABLE when the proof cannot be checked now.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Identity, error)
}

// ParseServiceAccount splits "<namespace>:<name>" (the --agent-service-account form); it
// errors when either part is empty or the separator is missing.
func ParseServiceAccount(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, ":")
	if !ok || namespace == "" || name == "" || strings.Contains(name, ":") {
		return "", "", fmt.Errorf("service account %q: want <namespace>:<name>", s)
	}
	return namespace, name, nil
}

// TokenReviewer is the Authenticator of the controller: it has the API server review the
// token (authentication.k8s.io/v1 TokenReview, audience TokenAudience), requires the
// agents' ServiceAccount and a token bound to a Pod, and takes the node from the review's
// user extra authentication.kubernetes.io/node-name (Kubernetes >= 1.32 puts it in tokens
// bound to a scheduled Pod) or, when absent, from the bound Pod's spec.nodeName (checking
// the Pod's UID). Needs RBAC create on tokenreviews and get on pods.
type TokenReviewer struct {
	client    kubernetes.Interface
	namespace string
	name      string
}

// NewTokenReviewer returns a TokenReviewer for agents running as serviceAccount
// ("<namespace>:<name>", see ParseServiceAccount, which gives its errors).
func NewTokenReviewer(client kubernetes.Interface, serviceAccount string) (*TokenReviewer, error) {
	ns, name, err := ParseServiceAccount(serviceAccount)
	if err != nil {
		return nil, err
	}
	return &TokenReviewer{client: client, namespace: ns, name: name}, nil
}

// Authenticate reviews token; see TokenReviewer and Authenticator for the outcomes.
func (t *TokenReviewer) Authenticate(ctx context.Context, token string) (Identity, error) {
	review, err := t.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{TokenAudience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, status.Errorf(codes.Unavailable, "token review: %v", err)
	}
	st := review.Status
	if !st.Authenticated {
		msg := st.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return Identity{}, status.Errorf(codes.Unauthenticated, "agent token refused: %s", msg)
	}
	if !serviceaccount.MatchesUsername(t.namespace, t.name, st.User.Username) {
		return Identity{}, status.Errorf(codes.PermissionDenied, "token of %q, not of the agents' service account %s:%s",
			st.User.Username, t.namespace, t.name)
	}
	extra := func(key string) string {
		if v := st.User.Extra[key]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	podName, podUID := extra(serviceaccount.PodNameKey), extra(serviceaccount.PodUIDKey)
	if podName == "" || podUID == "" {
		return Identity{}, status.Error(codes.Unauthenticated, "agent token is not bound to a Pod")
	}
	id := Identity{Pod: t.namespace + "/" + podName, Node: extra(serviceaccount.NodeNameKey)}
	if id.Node != "" {
		return id, nil
	}
	pod, err := t.client.CoreV1().Pods(t.namespace).Get(ctx, podName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return Identity{}, status.Errorf(codes.Unauthenticated, "agent token's Pod %s is gone", id.Pod)
	case err != nil:
		return Identity{}, status.Errorf(codes.Unavailable, "get Pod %s: %v", id.Pod, err)
	case pod.UID != types.UID(podUID):
		return Identity{}, status.Errorf(codes.Unauthenticated, "agent token's Pod %s was replaced", id.Pod)
	case pod.Spec.NodeName == "":
		return Identity{}, status.Errorf(codes.PermissionDenied, "agent token's Pod %s is not scheduled", id.Pod)
	}
	id.Node = pod.Spec.NodeName
	return id, nil
}
