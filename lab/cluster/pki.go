package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// certValidity is long enough for a lab left running for weeks by `make lab-up`.
const certValidity = 365 * 24 * time.Hour

// pki holds the file paths of the lab's generated credentials (all PEM, under Dir/pki) and the
// admin client credentials in memory for the kubeconfig and rest.Config.
type pki struct {
	caCert, servingCert, servingKey, saPub, saKey string
	// kubeletClientCert and Key are the API server's identity towards kubelets (logs, exec,
	// port-forward on the kubelet-backed cluster).
	kubeletClientCert, kubeletClientKey string
	caPEM, adminCertPEM, adminKeyPEM    []byte
	// ca and caKey sign the client certificates of the kubelet-backed cluster's components
	// (Cluster.WriteClientKubeconfig).
	ca    *x509.Certificate
	caKey crypto.Signer
}

// writePKI generates a fresh CA, a serving certificate for 127.0.0.1/localhost and the
// in-cluster names of the kubernetes Service (its ClusterIP and kubernetes.default.svc, which
// pods of the kubelet-backed cluster dial), an admin
// client certificate (CN=admin, O=system:masters) and a service-account key pair, all ECDSA
// P-256, and writes them under dir. Errors come from key generation, signing or file writes.
func writePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	p := &pki{
		caCert:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
		saKey:       filepath.Join(dir, "sa.key"),

		kubeletClientCert: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		kubeletClientKey:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}

	caKey, err := newKey()
	if err != nil {
		return nil, err
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "kuport-lab-ca"}, caKey)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	p.caPEM = pemBlock("CERTIFICATE", ca.Raw)
	p.ca, p.caKey = ca, caKey
	if err := certutil.WriteCert(p.caCert, p.caPEM); err != nil {
		return nil, fmt.Errorf("write CA: %w", err)
	}

	servingCertPEM, servingKeyPEM, err := signLeaf(ca, caKey, x509.Certificate{
		Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(KubernetesServiceIP)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("serving cert: %w", err)
	}
	if err := certutil.WriteCert(p.servingCert, servingCertPEM); err != nil {
		return nil, fmt.Errorf("write serving cert: %w", err)
	}
	if err := keyutil.WriteKey(p.servingKey, servingKeyPEM); err != nil {
		return nil, fmt.Errorf("write serving key: %w", err)
	}

	p.adminCertPEM, p.adminKeyPEM, err = signLeaf(ca, caKey, x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("admin cert: %w", err)
	}

	kcCert, kcKey, err := signLeaf(ca, caKey, x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("kubelet client cert: %w", err)
	}
	if err := certutil.WriteCert(p.kubeletClientCert, kcCert); err != nil {
		return nil, err
	}
	if err := keyutil.WriteKey(p.kubeletClientKey, kcKey); err != nil {
		return nil, err
	}

	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := keyutil.MarshalPrivateKeyToPEM(saKey)
	if err != nil {
		return nil, fmt.Errorf("encode service-account key: %w", err)
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("encode service-account public key: %w", err)
	}
	if err := keyutil.WriteKey(p.saKey, saKeyPEM); err != nil {
		return nil, fmt.Errorf("write service-account key: %w", err)
	}
	if err := keyutil.WriteKey(p.saPub, pemBlock("PUBLIC KEY", saPubDER)); err != nil {
		return nil, fmt.Errorf("write service-account public key: %w", err)
	}
	return p, nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	return k, nil
}

// signLeaf fills serial, validity and key usage into tmpl, signs it with the CA and returns the
// certificate and its new private key, PEM encoded.
func signLeaf(ca *x509.Certificate, caKey crypto.Signer, tmpl x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("serial: %w", err)
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign: %w", err)
	}
	keyPEM, err = keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
