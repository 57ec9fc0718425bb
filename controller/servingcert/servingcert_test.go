package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const ns = "kuport-system"

func newSource(client *fake.Clientset) *Secret {
	return &Secret{Client: client, Namespace: ns, Name: DefaultSecret, CAConfigMap: DefaultCAConfigMap, Names: DefaultNames(ns)}
}

// verify checks that c is valid for name at now under the CA of caPEM.
func verify(t *testing.T, caPEM []byte, c *tls.Certificate, name string, now time.Time) {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	_, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, CurrentTime: now})
	require.NoError(t, err)
}

func getSecret(t *testing.T, client *fake.Clientset) *corev1.Secret {
	t.Helper()
	sec, err := client.CoreV1().Secrets(ns).Get(context.Background(), DefaultSecret, metav1.GetOptions{})
	require.NoError(t, err)
	return sec
}

func getCA(t *testing.T, client *fake.Clientset) string {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), DefaultCAConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	return cm.Data[CACertKey]
}

// TestSecretCreatedWhenAbsent: the first Load generates the Secret (type kubernetes.io/tls with
// the CA) and publishes the CA, and only the CA, in the ConfigMap; the certificate verifies for
// every default name under that CA.
func TestSecretCreatedWhenAbsent(t *testing.T) {
	client := fake.NewClientset()
	c, err := newSource(client).Load(context.Background())
	require.NoError(t, err)

	sec := getSecret(t, client)
	assert.Equal(t, corev1.SecretTypeTLS, sec.Type)
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, CACertKey, caKeyKey} {
		assert.NotEmpty(t, sec.Data[k], k)
	}
	assert.Equal(t, string(sec.Data[CACertKey]), getCA(t, client), "the ConfigMap holds the Secret's CA")
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), DefaultCAConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{CACertKey}, keys(cm.Data), "the ConfigMap holds no private key")

	for _, name := range DefaultNames(ns) {
		verify(t, sec.Data[CACertKey], c, name, time.Now())
	}
	assert.WithinDuration(t, time.Now().Add(ServingValidity), c.Leaf.NotAfter, time.Minute)
	ca, _, err := (&Bundle{CACert: sec.Data[CACertKey], CAKey: sec.Data[caKeyKey]}).parseCA()
	require.NoError(t, err)
	assert.True(t, ca.IsCA)
	assert.WithinDuration(t, time.Now().Add(CAValidity), ca.NotAfter, time.Minute)
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestSecretReused: a Secret that exists and is not due is served as it is, by any replica,
// and nothing is written.
func TestSecretReused(t *testing.T) {
	client := fake.NewClientset()
	first, err := newSource(client).Load(context.Background())
	require.NoError(t, err)
	client.ClearActions()

	again, err := newSource(client).Load(context.Background())
	require.NoError(t, err)
	assert.Equal(t, first.Certificate, again.Certificate)
	for _, a := range client.Actions() {
		assert.Equal(t, "get", a.GetVerb(), "%s %s", a.GetVerb(), a.GetResource().Resource)
	}
}

// TestRacingReplicasShareOneSecret: two replicas that both find the Secret absent both
// generate, one creates it, and the other reads and serves the winner's: one Secret, one CA.
func TestRacingReplicasShareOneSecret(t *testing.T) {
	client := fake.NewClientset()
	// Both replicas' first Get sees no Secret, as when both read before either created it
	// (the fake clientset runs reactors one at a time).
	gets := 0
	client.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if gets++; gets <= 2 {
			return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), DefaultSecret)
		}
		return false, nil, nil
	})
	var (
		wg    sync.WaitGroup
		certs [2]*tls.Certificate
		errs  [2]error
	)
	for i := range certs {
		wg.Go(func() { certs[i], errs[i] = newSource(client).Load(context.Background()) })
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, certs[0].Certificate, certs[1].Certificate, "both replicas serve the same certificate")

	creates := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "secrets" {
			creates++
		}
	}
	assert.Equal(t, 2, creates, "both replicas tried to create the Secret")
	secrets, err := client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, secrets.Items, 1)
	assert.Equal(t, string(secrets.Items[0].Data[CACertKey]), getCA(t, client))
	verify(t, secrets.Items[0].Data[CACertKey], certs[1], "kuport-controller."+ns+".svc", time.Now())
}

// TestSecretReissuedWhenDue: a serving certificate with less than a third of its lifetime
// left, or lacking a name now asked for, is reissued with the same CA, so agents keep
// verifying it; the ConfigMap is left as it is.
func TestSecretReissuedWhenDue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		age   time.Duration
		names []string
	}{
		{name: "expiring", age: ServingValidity * 2 / 3, names: DefaultNames(ns)},
		{name: "new name", names: append(DefaultNames(ns), "kuport.example.org")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			src := newSource(client)
			src.now = func() time.Time { return time.Now().Add(-tc.age) }
			old, err := src.Load(context.Background())
			require.NoError(t, err)
			ca := getCA(t, client)

			src = newSource(client)
			src.Names = tc.names
			renewed, err := src.Load(context.Background())
			require.NoError(t, err)
			assert.NotEqual(t, old.Certificate, renewed.Certificate, "reissued")
			assert.Equal(t, ca, string(getSecret(t, client).Data[CACertKey]), "same CA")
			assert.Equal(t, ca, getCA(t, client))
			for _, n := range tc.names {
				verify(t, []byte(ca), renewed, n, time.Now().Add(ServingValidity/2))
			}
		})
	}
}

// TestConfigMapRepublished: a ConfigMap holding another CA (the Secret was deleted and
// regenerated, or someone edited it) is set back to the Secret's.
func TestConfigMapRepublished(t *testing.T) {
	client := fake.NewClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultCAConfigMap, Namespace: ns},
		Data:       map[string]string{CACertKey: "stale"},
	})
	_, err := newSource(client).Load(context.Background())
	require.NoError(t, err)
	assert.Equal(t, string(getSecret(t, client).Data[CACertKey]), getCA(t, client))
}

// TestForeignSecretRefused: a Secret without the CA key (not one kuport generated) is an
// error, not overwritten.
func TestForeignSecretRefused(t *testing.T) {
	b, err := Generate([]string{"x"}, time.Now())
	require.NoError(t, err)
	client := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultSecret, Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: b.Cert, corev1.TLSPrivateKeyKey: b.Key},
	})
	_, err = newSource(client).Load(context.Background())
	require.ErrorContains(t, err, "ca.key")
	assert.Equal(t, b.Cert, getSecret(t, client).Data[corev1.TLSCertKey])
}

// TestReloaderFollowsFiles: the Reloader serves the files' certificate and, after a reload,
// the one written over them (cert-manager renewing its Secret).
func TestReloaderFollowsFiles(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func() *Bundle {
		b, err := Generate([]string{"kuport-controller.example"}, time.Now())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(certFile, b.Cert, 0o600))
		require.NoError(t, os.WriteFile(keyFile, b.Key, 0o600))
		return b
	}
	first := write()
	r, err := NewReloader(context.Background(), Files(certFile, keyFile), nil)
	require.NoError(t, err)
	served := func() []byte {
		c, err := r.TLSConfig().GetCertificate(nil)
		require.NoError(t, err)
		return c.Certificate[0]
	}
	assert.Equal(t, der(t, first.Cert), served())

	second := write()
	require.NoError(t, r.reload(context.Background()))
	assert.Equal(t, der(t, second.Cert), served())

	require.NoError(t, os.WriteFile(keyFile, []byte("garbage"), 0o600))
	require.Error(t, r.reload(context.Background()))
	assert.Equal(t, der(t, second.Cert), served(), "a failed reload keeps the certificate")

	_, err = NewReloader(context.Background(), Files(certFile, filepath.Join(dir, "missing")), nil)
	require.Error(t, err)
}

// der is the first certificate of a PEM file's content.
func der(t *testing.T, pemData []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(pemData)
	require.NotNil(t, block)
	return block.Bytes
}
