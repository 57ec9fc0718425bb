// Package servingcert provides the TLS serving certificate of the controller's gRPC listeners,
// so that the agent stream, which carries each agent's token, is encrypted and the agents can
// verify whom they talk to (docs/security.md#the-agent-stream-is-tls).
//
// The certificate comes from one of two sources, reloaded every RefreshInterval by a Reloader:
//   - Files: a certificate and key on disk, for example a cert-manager Certificate's Secret
//     mounted as a volume (cert-manager renews it; the next reload serves the new one);
//   - Secret: the default in a cluster. Every replica reads one Secret of type
//     kubernetes.io/tls in its namespace; the first to find it absent generates a CA and a
//     serving certificate signed by it and creates the Secret (a replica that loses that race
//     reads the winner's), and a replica that finds the serving certificate due reissues it
//     with the same CA. The CA's certificate, its public part only, is published in a
//     ConfigMap that the agent DaemonSet mounts: agents hold no RBAC, the kubelet reads it.
package servingcert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Defaults of the controller's flags; deploy/ names the same objects.
const (
	// DefaultSecret holds the generated CA and serving certificate.
	DefaultSecret = "kuport-controller-tls"
	// DefaultCAConfigMap publishes the CA certificate to the agents.
	DefaultCAConfigMap = "kuport-controller-ca"
	// Service is the controller's Service in deploy/, whose DNS names DefaultNames lists.
	Service = "kuport-controller"
	// CACertKey is the CA certificate's key in the Secret and in the ConfigMap (so the file
	// the kubelet mounts is ca.crt).
	CACertKey = "ca.crt"
	// caKeyKey is the CA's private key, in the Secret only: a replica reissues the serving
	// certificate with it.
	caKeyKey = "ca.key"

	// CAValidity and ServingValidity are the lifetimes of what Generate makes. The serving
	// certificate is reissued once less than a third of its lifetime is left, so with
	// RefreshInterval it never expires while a replica runs; the CA is not rotated.
	CAValidity      = 10 * 365 * 24 * time.Hour
	ServingValidity = 365 * 24 * time.Hour
	// RefreshInterval is how often a Reloader reads its source again.
	RefreshInterval = time.Minute
)

// DefaultNames are the names the generated serving certificate is valid for: the DNS names of
// the controller's Service in namespace, through which agents reach it, and 127.0.0.1, where
// `kubectl port-forward` (and the lab) expose a replica to grpcurl.
func DefaultNames(namespace string) []string {
	return []string{
		Service,
		Service + "." + namespace,
		Service + "." + namespace + ".svc",
		Service + "." + namespace + ".svc.cluster.local",
		"127.0.0.1",
	}
}

// Bundle is a CA and a serving certificate it signed, PEM encoded, as the Secret holds them.
type Bundle struct {
	CACert, CAKey, Cert, Key []byte
}

// Generate makes a new CA (CAValidity) and a serving certificate signed by it for names (DNS
// names, or IP addresses), valid from an hour before now for ServingValidity.
func Generate(names []string, now time.Time) (*Bundle, error) {
	if len(names) == 0 {
		return nil, errors.New("serving certificate: no names")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: Service + "-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := sign(tmpl, nil, key, key.Public(), now, CAValidity)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	return issue(ca, key, names, now)
}

// issue signs a serving certificate for names with the CA, with a new key.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, names []string, now time.Time) (*Bundle, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: names[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := sign(tmpl, ca, caKey, key.Public(), now, ServingValidity)
	if err != nil {
		return nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	caKeyPEM, err := encodeKey(caKey)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Bundle{
		CACert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
		CAKey:  caKeyPEM,
		Cert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:    keyPEM,
	}, nil
}

// sign fills tmpl's serial number and validity (from an hour before now, for clock skew) and
// signs it with parentKey; a nil parent self-signs.
func sign(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, pub any, now time.Time, validity time.Duration) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(validity)
	if parent == nil {
		parent = tmpl
	}
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCA decodes the Bundle's CA certificate and key.
func (b *Bundle) parseCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certBlock, _ := pem.Decode(b.CACert)
	keyBlock, _ := pem.Decode(b.CAKey)
	if certBlock == nil || keyBlock == nil {
		return nil, nil, errors.New("no PEM CA certificate and key")
	}
	ca, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	key, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	ecKey, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("CA key is a %T, not ECDSA", key)
	}
	return ca, ecKey, nil
}

// Certificate is the serving certificate and key for a tls.Config (Leaf set).
func (b *Bundle) Certificate() (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(b.Cert, b.Key)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	return &c, nil
}

// due says why the serving certificate must be reissued at now ("" when it need not): it
// does not parse, is not signed by the CA, lacks one of names, or has less than a third of
// its lifetime left.
func (b *Bundle) due(ca *x509.Certificate, names []string, now time.Time) string {
	c, err := b.Certificate()
	if err != nil {
		return err.Error()
	}
	leaf := c.Leaf
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		return "not signed by the CA in " + CACertKey
	}
	for _, n := range names {
		if leaf.VerifyHostname(n) != nil {
			return "not valid for " + n
		}
	}
	if renewAt := leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 3); !now.Before(renewAt) {
		return "expires at " + leaf.NotAfter.UTC().Format(time.RFC3339)
	}
	return ""
}

// Files returns a load function (for NewReloader) reading a PEM certificate (chain) and key
// from disk, as a mounted cert-manager Secret holds them.
func Files(certFile, keyFile string) func(context.Context) (*tls.Certificate, error) {
	return func(context.Context) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		return &c, nil
	}
}

// Secret is the Secret source of the serving certificate (see the package doc).
type Secret struct {
	Client kubernetes.Interface
	// Namespace holds the Secret and the ConfigMap: the controller's own.
	Namespace string
	// Name is the Secret's name (DefaultSecret); CAConfigMap the ConfigMap's
	// (DefaultCAConfigMap).
	Name, CAConfigMap string
	// Names are the DNS names and IP addresses the serving certificate must be valid for
	// (DefaultNames).
	Names []string
	// Log receives what Load generated or reissued; nil discards.
	Log hclog.Logger

	now func() time.Time // time.Now when nil
}

// raced reports a write that lost to another replica's: Load then reads again.
func raced(err error) bool { return apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) }

// Load returns the serving certificate of the Secret. It creates the Secret with a new CA when
// it is absent, reissues the serving certificate with the Secret's CA when it is due, and
// writes the CA certificate to the ConfigMap when that differs; a write that loses a race to
// another replica's reads what the winner wrote. A Secret holding no CA key (one kuport did not
// generate) is an error: serve such a certificate with Files.
func (s *Secret) Load(ctx context.Context) (*tls.Certificate, error) {
	var b *Bundle
	if err := retry.OnError(retry.DefaultRetry, raced, func() (err error) {
		b, err = s.ensureSecret(ctx)
		return err
	}); err != nil {
		return nil, fmt.Errorf("serving certificate secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	if err := retry.OnError(retry.DefaultRetry, raced, func() error { return s.publishCA(ctx, b.CACert) }); err != nil {
		return nil, fmt.Errorf("CA configmap %s/%s: %w", s.Namespace, s.CAConfigMap, err)
	}
	return b.Certificate()
}

// ensureSecret reads the Secret, creating or updating it as Load says.
func (s *Secret) ensureSecret(ctx context.Context) (*Bundle, error) {
	log := s.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	secrets := s.Client.CoreV1().Secrets(s.Namespace)
	sec, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		b, err := Generate(s.Names, now())
		if err != nil {
			return nil, err
		}
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: map[string]string{"app.kubernetes.io/name": Service}},
			Type:       corev1.SecretTypeTLS,
		}
		b.store(sec)
		if _, err := secrets.Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		log.Info("generated a CA and a serving certificate", "secret", s.Name, "names", s.Names)
		return b, nil
	}
	if err != nil {
		return nil, err
	}
	b := &Bundle{CACert: sec.Data[CACertKey], CAKey: sec.Data[caKeyKey], Cert: sec.Data[corev1.TLSCertKey], Key: sec.Data[corev1.TLSPrivateKeyKey]}
	ca, caKey, err := b.parseCA()
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", CACertKey, caKeyKey, err)
	}
	why := b.due(ca, s.Names, now())
	if why == "" {
		return b, nil
	}
	if b, err = issue(ca, caKey, s.Names, now()); err != nil {
		return nil, err
	}
	b.store(sec)
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	log.Info("reissued the serving certificate", "secret", s.Name, "reason", why, "names", s.Names)
	return b, nil
}

// store writes the Bundle into the Secret's data.
func (b *Bundle) store(sec *corev1.Secret) {
	sec.Data = map[string][]byte{
		corev1.TLSCertKey:       b.Cert,
		corev1.TLSPrivateKeyKey: b.Key,
		CACertKey:               b.CACert,
		caKeyKey:                b.CAKey,
	}
}

// publishCA makes the ConfigMap hold caCert under CACertKey.
func (s *Secret) publishCA(ctx context.Context, caCert []byte) error {
	configMaps := s.Client.CoreV1().ConfigMaps(s.Namespace)
	cm, err := configMaps.Get(ctx, s.CAConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = configMaps.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: s.CAConfigMap, Namespace: s.Namespace, Labels: map[string]string{"app.kubernetes.io/name": Service}},
			Data:       map[string]string{CACertKey: string(caCert)},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if cm.Data[CACertKey] == string(caCert) {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CACertKey] = string(caCert)
	_, err = configMaps.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

// Reloader holds the serving certificate its load function returned last, for a tls.Config,
// and calls the function again every RefreshInterval while Run runs.
type Reloader struct {
	load func(context.Context) (*tls.Certificate, error)
	log  hclog.Logger
	cert atomic.Pointer[tls.Certificate]
}

// NewReloader loads the first certificate; an error stops the controller before it serves.
func NewReloader(ctx context.Context, load func(context.Context) (*tls.Certificate, error), log hclog.Logger) (*Reloader, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	r := &Reloader{load: load, log: log}
	if err := r.reload(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// reload calls load and serves its certificate, logging its names and expiry when it differs
// from the one served so far.
func (r *Reloader) reload(ctx context.Context) error {
	c, err := r.load(ctx)
	if err != nil {
		return err
	}
	if old := r.cert.Swap(c); old == nil || !bytes.Equal(old.Certificate[0], c.Certificate[0]) {
		names := append([]string(nil), c.Leaf.DNSNames...)
		for _, ip := range c.Leaf.IPAddresses {
			names = append(names, ip.String())
		}
		r.log.Info("serving certificate loaded", "names", strings.Join(names, ","), "issuer", c.Leaf.Issuer.CommonName,
			"not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// Run reloads every RefreshInterval until ctx ends; a failed reload keeps the current
// certificate and is logged.
func (r *Reloader) Run(ctx context.Context) {
	t := time.NewTicker(RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.reload(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("serving certificate not reloaded; serving the current one", "error", err)
			}
		}
	}
}

// TLSConfig is the listeners' TLS configuration: TLS 1.3 (both ends are kuport's, and
// grpcurl's), serving the current certificate on every handshake.
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.cert.Load(), nil },
	}
}
