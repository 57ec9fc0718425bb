package v1alpha1

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestOrDefaultIsTheCRDs: the defaults Go applies to an unset mode are the ones the CRD's
// markers give the API server, read from the generated CRD.
func TestOrDefaultIsTheCRDs(t *testing.T) {
	b, err := os.ReadFile("../../deploy/crds/kuport.wlz.li_portmapclasses.yaml")
	require.NoError(t, err)
	crd := &apiextensionsv1.CustomResourceDefinition{}
	require.NoError(t, yaml.Unmarshal(b, crd))
	require.Len(t, crd.Spec.Versions, 1)
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	crdDefault := func(s apiextensionsv1.JSONSchemaProps) string {
		t.Helper()
		require.NotNil(t, s.Default)
		var v string
		require.NoError(t, json.Unmarshal(s.Default.Raw, &v))
		return v
	}
	require.Equal(t, crdDefault(spec.Properties["servingMode"]), string(ServingMode("").OrDefault()))
	require.Equal(t, crdDefault(spec.Properties["returnPath"].Properties["mode"]), string(ReturnPathMode("").OrDefault()))
	require.Equal(t, ServingModeMulti, ServingModeMulti.OrDefault(), "a set mode is kept")
	require.Equal(t, ReturnPathNone, ReturnPathNone.OrDefault(), "a set mode is kept")
}
