package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/agents"
	"kuport.wlz.li/kuport/controller/leader"
	"kuport.wlz.li/kuport/controller/servingcert"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/cluster"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPrivilegedE2EAuth shows agents prove their node
// (docs/security.md#agents-prove-their-node): over the agents' own unix socket, a stream
// without a token, with a token of another audience, or with edge-a's token saying Hello as
// worker-b is refused, and so is inspection; the lab's agents, each with its own minted
// token, are connected and serve; the metrics port admits a scraper's token only once it is
// bound to kuport-metrics-reader (docs/dashboard.md#who-may-read-them); and the inspection
// surface shows per-node and per-mapping state.
func TestPrivilegedE2EAuth(t *testing.T) {
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc := programService(t)
	for _, n := range []string{"edge-a", "worker-b"} {
		waitAgent(t, svc, n, "")
	}

	socket := "unix://" + filepath.Join(cluster.DefaultDir, lab.ReplicaSocket(0))
	conn, err := grpc.NewClient(socket, grpc.WithTransportCredentials(controllerTLS(t, lab.ControllerServerName)))
	require.NoError(t, err)
	defer conn.Close()
	connectAs := func(token, node string) error {
		sctx := ctx
		if token != "" {
			sctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		stream, err := kuportv1.NewAgentServiceClient(conn).Connect(sctx)
		require.NoError(t, err)
		_ = stream.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Hello{Hello: &kuportv1.Hello{Node: node}}})
		_, err = stream.Recv()
		return err
	}
	edgeToken, err := os.ReadFile(l.AgentTokenFile("edge-a"))
	require.NoError(t, err)

	t.Run("the agents' stream is TLS with the certificate the controller generated", func(t *testing.T) {
		sec, err := l.Kube.CoreV1().Secrets(leader.DefaultNamespace).Get(ctx, servingcert.DefaultSecret, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, corev1.SecretTypeTLS, sec.Type)
		ca, err := os.ReadFile(filepath.Join(cluster.DefaultDir, lab.ControllerCAFile))
		require.NoError(t, err)
		assert.Equal(t, string(sec.Data[servingcert.CACertKey]), string(ca), "the agents trust the Secret's CA")

		for name, creds := range map[string]credentials.TransportCredentials{
			"plaintext":          insecure.NewCredentials(),
			"another CA":         credentials.NewTLS(&tls.Config{RootCAs: x509.NewCertPool(), ServerName: lab.ControllerServerName}),
			"another name":       controllerTLS(t, "kuport-controller.elsewhere.svc"),
			"the Service's name": controllerTLS(t, lab.ControllerServerName),
		} {
			c, err := grpc.NewClient(socket, grpc.WithTransportCredentials(creds))
			require.NoError(t, err)
			_, err = healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
			_ = c.Close()
			if name == "the Service's name" {
				assert.NoError(t, err, name)
			} else {
				assert.Equal(t, codes.Unavailable, status.Code(err), "%s: %v", name, err)
			}
		}
	})

	t.Run("the API server binds the token to the agent's Pod and node", func(t *testing.T) {
		review, err := l.Kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{
			Token: string(edgeToken), Audiences: []string{agents.TokenAudience},
		}}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.True(t, review.Status.Authenticated, review.Status.Error)
		assert.Equal(t, "system:serviceaccount:kuport-system:kuport-agent", review.Status.User.Username)
		assert.Equal(t, authnv1.ExtraValue{lab.AgentPod("edge-a")}, review.Status.User.Extra["authentication.kubernetes.io/pod-name"])
		assert.Equal(t, authnv1.ExtraValue{"edge-a"}, review.Status.User.Extra["authentication.kubernetes.io/node-name"])
	})

	t.Run("a stream without a token is refused", func(t *testing.T) {
		err := connectAs("", "edge-a")
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	})

	t.Run("a token of another audience is refused", func(t *testing.T) {
		pod, err := l.Kube.CoreV1().Pods("kuport-system").Get(ctx, lab.AgentPod("edge-a"), metav1.GetOptions{})
		require.NoError(t, err)
		tr, err := l.Kube.CoreV1().ServiceAccounts("kuport-system").CreateToken(ctx, "kuport-agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(600)),
			BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		}}, metav1.CreateOptions{})
		require.NoError(t, err)
		err = connectAs(tr.Status.Token, "edge-a")
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	})

	t.Run("edge-a's token saying Hello as worker-b is refused", func(t *testing.T) {
		err := connectAs(string(edgeToken), "worker-b")
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, `proves node "edge-a", not "worker-b"`)
		log, err := os.ReadFile(l.ReplicaLog(0))
		require.NoError(t, err)
		assert.Contains(t, string(log), "agent stream refused")
		waitAgent(t, svc, "worker-b", "")
	})

	t.Run("inspection is refused on the agents' socket", func(t *testing.T) {
		_, err := kuportv1.NewProgramServiceClient(conn).ListNodes(ctx, &kuportv1.ListNodesRequest{})
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	})

	t.Run("the metrics port admits a token kuport-metrics-reader allows, over TLS only", func(t *testing.T) {
		// Two ServiceAccounts of a scraper's, one bound to the ClusterRole deploy/rbac.yaml
		// ships, as docs/dashboard.md binds Prometheus's.
		const ns = "default"
		token := func(name string) string {
			_, err := l.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			require.NoError(t, err)
			tr, err := l.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
				ExpirationSeconds: ptr.To(int64(600)),
			}}, metav1.CreateOptions{})
			require.NoError(t, err)
			return tr.Status.Token
		}
		scraper, bystander := token("scraper"), token("bystander")
		_, err := l.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "scraper-kuport-metrics"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kuport-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "scraper", Namespace: ns}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)

		ca, err := os.ReadFile(filepath.Join(cluster.DefaultDir, lab.ControllerCAFile))
		require.NoError(t, err)
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(ca))
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: lab.ControllerServerName}}}
		get := func(path, token string) (int, string) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+lab.ControllerHTTPSAddr+path, nil)
			require.NoError(t, err)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(body)
		}
		code, _ := get("/metrics", "")
		assert.Equal(t, http.StatusUnauthorized, code, "no token")
		code, _ = get("/metrics", string(edgeToken))
		assert.Equal(t, http.StatusUnauthorized, code, "an agent's token, of audience kuport")
		code, _ = get("/metrics", bystander)
		assert.Equal(t, http.StatusForbidden, code, "a token without the binding")
		code, body := get("/metrics", scraper)
		assert.Equal(t, http.StatusOK, code, body)
		assert.Regexp(t, `(?m)^kuport_agents_connected \d`, body)
		code, body = get("/state", scraper)
		assert.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"overview"`)
		code, _ = get("/debug/pprof/", scraper)
		assert.Equal(t, http.StatusForbidden, code, "a path the role does not grant")

		resp, err := http.Get("http://" + lab.ControllerHTTPSAddr + "/metrics")
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP on the TLS port")
	})

	t.Run("ListNodes and GetMapping show agent and mapping state", func(t *testing.T) {
		remote := lab.DemoScenarios()[1]
		require.NoError(t, l.StartScenario(ctx, remote))
		waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "True", 30*time.Second)
		assertAnswers(t, l, remote.Port)

		// Reports come every 2 s in the lab: wait for every agent's first one.
		require.Eventually(t, func() bool {
			nodes, err := svc.ListNodes(ctx, &kuportv1.ListNodesRequest{})
			if err != nil {
				return false
			}
			for _, n := range nodes.Nodes {
				if n.Epoch == 0 || n.ConnectedSince == nil || n.LastReportTime == nil {
					return false
				}
			}
			return len(nodes.Nodes) > 0
		}, 20*time.Second, 200*time.Millisecond, "ListNodes rows without epoch, connected_since or last_report_time")
		// Wait for the probe's packets in edge-a's counter, and for a report of each node made
		// after its link was created.
		var m *kuportv1.GetMappingResponse
		require.Eventually(t, func() bool {
			m, err = svc.GetMapping(ctx, &kuportv1.GetMappingRequest{Namespace: lab.DemoNamespace, Name: remote.Name})
			if err != nil || len(m.Nodes) != 2 || len(m.Nodes[0].Links) == 0 || len(m.Nodes[1].Links) == 0 {
				return false
			}
			for _, c := range m.Nodes[0].Counters {
				if c.Id == "demo/remote/dnat/enp1s0" && c.Packets > 0 {
					return true
				}
			}
			return false
		}, 20*time.Second, 200*time.Millisecond, "GetMapping: %v %v", m, err)
		for i, node := range []string{"edge-a", "worker-b"} {
			mn := m.Nodes[i]
			assert.Equal(t, node, mn.Node)
			assert.True(t, mn.Acked, node)
			assert.True(t, mn.Ready, "%s: %s", node, mn.Message)
			require.Len(t, mn.Links, 1, node)
		}
		assert.Contains(t, m.Nodes[0].EntryIds, "demo/remote/dnat/enp1s0")
		assert.Contains(t, m.Nodes[0].EntryIds, linkOnEdgeA)
		assert.Equal(t, linkOnWorkerB, m.Nodes[1].Links[0].Name)
	})
}
