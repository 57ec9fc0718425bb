package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/controller/leader"
	"kuport.wlz.li/kuport/controller/servingcert"
)

// The controller replicas serve TLS as in a cluster: with their default flags the first one
// generates the Secret servingcert.DefaultSecret in leader.DefaultNamespace and publishes its
// CA in the ConfigMap servingcert.DefaultCAConfigMap. The lab copies that CA to
// ControllerCAFile, as the kubelet mounts the ConfigMap for deploy/agent.yaml, and the agents,
// whose targets are unix sockets, verify the Service name ControllerServerName.
const (
	// ControllerCAFile is the copy of the controller's CA, relative to the lab dir: the
	// agents' --controller-ca-file, and grpcurl's -cacert.
	ControllerCAFile = "controller-ca.crt"
	// ControllerServerName is the name the agents verify in the controller's certificate
	// (--controller-server-name): its Service's, as a DaemonSet's agent dials it.
	ControllerServerName = servingcert.Service + "." + leader.DefaultNamespace + ".svc"
)

// writeControllerCA waits until a controller replica has published its CA and writes it to
// ControllerCAFile, replacing the file in one rename so that an agent never reads half of it.
func (l *Lab) writeControllerCA(ctx context.Context) error {
	var ca string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cm, err := l.Kube.CoreV1().ConfigMaps(leader.DefaultNamespace).Get(ctx, servingcert.DefaultCAConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ca = cm.Data[servingcert.CACertKey]
		return ca != "", nil
	})
	if err != nil {
		return fmt.Errorf("lab: the controller's CA (ConfigMap %s/%s): %w", leader.DefaultNamespace, servingcert.DefaultCAConfigMap, err)
	}
	path := filepath.Join(l.opt.Dir, ControllerCAFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(ca), 0o644); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return nil
}
