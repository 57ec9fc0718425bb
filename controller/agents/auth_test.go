package agents

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const agentUser = "system:serviceaccount:kuport-system:kuport-agent"

// podExtra is the user extra of a token bound to Pod kuport-system/<pod> (uid) on node ("" for
// a token minted before Kubernetes put the node in it).
func podExtra(pod, uid, node string) map[string]authnv1.ExtraValue {
	e := map[string]authnv1.ExtraValue{
		"authentication.kubernetes.io/pod-name": {pod},
		"authentication.kubernetes.io/pod-uid":  {uid},
	}
	if node != "" {
		e["authentication.kubernetes.io/node-name"] = authnv1.ExtraValue{node}
	}
	return e
}

// fakeReviewer is a TokenReviewer over a fake clientset holding the agent Pods of edge-a
// (uid-a) and worker-b (uid-b), whose API server answers TokenReviews from reviews, keyed by
// token (unknown tokens are not authenticated; "api-down" fails the call). It also checks
// every review asks for audience "kuport".
func fakeReviewer(t *testing.T) *TokenReviewer {
	t.Helper()
	reviews := map[string]authnv1.TokenReviewStatus{
		"edge-a": {Authenticated: true, User: authnv1.UserInfo{Username: agentUser, Extra: podExtra("kuport-agent-edge-a", "uid-a", "edge-a")}},
		// Before Kubernetes 1.32 the node is not in the token: the Pod tells it.
		"worker-b-old": {Authenticated: true, User: authnv1.UserInfo{Username: agentUser, Extra: podExtra("kuport-agent-worker-b", "uid-b", "")}},
		"replaced-pod": {Authenticated: true, User: authnv1.UserInfo{Username: agentUser, Extra: podExtra("kuport-agent-worker-b", "uid-old", "")}},
		"gone-pod":     {Authenticated: true, User: authnv1.UserInfo{Username: agentUser, Extra: podExtra("kuport-agent-gone", "uid-g", "")}},
		"unbound":      {Authenticated: true, User: authnv1.UserInfo{Username: agentUser}},
		"other-sa": {Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:kuport-system:kuport-controller",
			Extra: podExtra("kuport-controller-0", "uid-c", "edge-a")}},
		"expired": {Authenticated: false, Error: "token has expired"},
	}
	pod := func(name, uid, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kuport-system", Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node}}
	}
	client := fake.NewClientset(pod("kuport-agent-edge-a", "uid-a", "edge-a"), pod("kuport-agent-worker-b", "uid-b", "worker-b"))
	client.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		assert.Equal(t, []string{"kuport"}, tr.Spec.Audiences)
		if tr.Spec.Token == "api-down" {
			return true, nil, errors.New("connection refused")
		}
		out := tr.DeepCopy()
		out.Status = reviews[tr.Spec.Token]
		return true, out, nil
	})
	r, err := NewTokenReviewer(client, DefaultAgentServiceAccount)
	require.NoError(t, err)
	return r
}

func TestTokenReviewer(t *testing.T) {
	r := fakeReviewer(t)
	for _, tc := range []struct {
		token   string
		want    Identity
		code    codes.Code
		message string
	}{
		{token: "edge-a", want: Identity{Node: "edge-a", Pod: "kuport-system/kuport-agent-edge-a"}},
		{token: "worker-b-old", want: Identity{Node: "worker-b", Pod: "kuport-system/kuport-agent-worker-b"}},
		{token: "replaced-pod", code: codes.Unauthenticated, message: "was replaced"},
		{token: "gone-pod", code: codes.Unauthenticated, message: "is gone"},
		{token: "unbound", code: codes.Unauthenticated, message: "not bound to a Pod"},
		{token: "other-sa", code: codes.PermissionDenied, message: "not of the agents' service account kuport-system:kuport-agent"},
		{token: "expired", code: codes.Unauthenticated, message: "token has expired"},
		{token: "garbage", code: codes.Unauthenticated, message: "not authenticated"},
		{token: "api-down", code: codes.Unavailable, message: "connection refused"},
	} {
		t.Run(tc.token, func(t *testing.T) {
			id, err := r.Authenticate(context.Background(), tc.token)
			if tc.code == codes.OK {
				require.NoError(t, err)
				assert.Equal(t, tc.want, id)
				return
			}
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, tc.message)
		})
	}
}

func TestParseServiceAccount(t *testing.T) {
	ns, name, err := ParseServiceAccount("kuport-system:kuport-agent")
	require.NoError(t, err)
	assert.Equal(t, []string{"kuport-system", "kuport-agent"}, []string{ns, name})
	for _, bad := range []string{"", "kuport-agent", ":kuport-agent", "kuport-system:", "a:b:c"} {
		_, _, err := ParseServiceAccount(bad)
		assert.Error(t, err, bad)
	}
	_, err = NewTokenReviewer(fake.NewClientset(), "kuport-agent")
	assert.Error(t, err)
}
