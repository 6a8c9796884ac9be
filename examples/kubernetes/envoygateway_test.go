package kubernetes_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The part of Envoy Gateway's configuration API the snippets use, mirrored
// field for field (JSON names and types) from envoyproxy/gateway
// api/v1alpha1@d32f282942, so that a strict decoding fails on any field
// EG does not have there. (The EG module itself is not a dependency: it
// brings the whole control plane.)

// envoyGateway is EnvoyGateway (envoygateway_types.go), whose
// EnvoyGatewaySpec is inline.
type envoyGateway struct {
	metav1.TypeMeta `json:",inline"`
	envoyGatewaySpec
}

// envoyGatewaySpec is EnvoyGatewaySpec: gateway, provider, logging,
// rateLimit (of its fields, the ones used).
type envoyGatewaySpec struct {
	Gateway *struct {
		ControllerName string `json:"controllerName,omitempty"`
	} `json:"gateway,omitempty"`
	Provider *struct {
		Type       string                `json:"type"`
		Kubernetes *egKubernetesProvider `json:"kubernetes,omitempty"`
	} `json:"provider,omitempty"`
	Logging *struct {
		Level map[string]string `json:"level,omitempty"`
	} `json:"logging,omitempty"`
	RateLimit *struct {
		Backend struct {
			Type  string `json:"type"`
			Redis *struct {
				URL *string `json:"url,omitempty"`
			} `json:"redis,omitempty"`
		} `json:"backend"`
		Timeout    *string `json:"timeout,omitempty"`
		FailClosed bool    `json:"failClosed"`
	} `json:"rateLimit,omitempty"`
}

// egKubernetesProvider is EnvoyGatewayKubernetesProvider's inline
// EnvoyGatewayKubernetesInfrastructureConfiguration: rateLimitDeployment
// (KubernetesDeploymentSpec), rateLimitHpa, rateLimitPDB.
type egKubernetesProvider struct {
	RateLimitDeployment *struct {
		Replicas  *int32 `json:"replicas,omitempty"`
		Container *struct {
			// KubernetesContainerSpec (shared_types.go).
			Env             []corev1.EnvVar              `json:"env,omitempty"`
			Resources       *corev1.ResourceRequirements `json:"resources,omitempty"`
			SecurityContext *corev1.SecurityContext      `json:"securityContext,omitempty"`
			Image           *string                      `json:"image,omitempty"`
			ImageRepository *string                      `json:"imageRepository,omitempty"`
			VolumeMounts    []corev1.VolumeMount         `json:"volumeMounts,omitempty"`
		} `json:"container,omitempty"`
	} `json:"rateLimitDeployment,omitempty"`
	RateLimitHpa *struct {
		MinReplicas *int32 `json:"minReplicas,omitempty"`
		MaxReplicas *int32 `json:"maxReplicas"`
	} `json:"rateLimitHpa,omitempty"`
	RateLimitPDB *struct {
		MinAvailable   *intstr.IntOrString `json:"minAvailable,omitempty"`
		MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	} `json:"rateLimitPDB,omitempty"`
}

// egImage is the CEL rule EG validates KubernetesContainerSpec.Image with
// (shared_types.go): a tag is required.
var egImage = regexp.MustCompile(`^[a-zA-Z0-9._-]+(:[0-9]+)?(/[a-zA-Z0-9._/-]+)?(:[a-zA-Z0-9._-]+)?(@sha256:[a-z0-9]+)?$`)

func TestEnvoyGatewayConfig(t *testing.T) {
	const file = "envoy-gateway/envoy-gateway-config.yaml"
	ms := load(t, file)
	// The names EG's Helm chart gives its configuration
	// (charts/gateway-helm/templates/envoy-gateway-config.yaml).
	cm := only[*corev1.ConfigMap](t, ms, "envoy-gateway-config")
	if cm.Namespace != "envoy-gateway-system" {
		t.Errorf("ConfigMap namespace %q, want envoy-gateway-system", cm.Namespace)
	}
	data, ok := cm.Data["envoy-gateway.yaml"]
	if !ok || len(cm.Data) != 1 {
		t.Fatalf("ConfigMap keys %v, want only envoy-gateway.yaml", cm.Data)
	}
	var eg envoyGateway
	decodeStrict(t, file+" envoy-gateway.yaml", []byte(data), &eg)
	if eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" || eg.Kind != "EnvoyGateway" {
		t.Errorf("%s %s, want gateway.envoyproxy.io/v1alpha1 EnvoyGateway", eg.APIVersion, eg.Kind)
	}
	checkEnvoyGateway(t, eg.envoyGatewaySpec, true)
}

func TestEnvoyGatewayHelmValues(t *testing.T) {
	const file = "envoy-gateway/helm-values.yaml"
	var values struct {
		Global struct {
			Images struct {
				Ratelimit struct {
					Image      string `json:"image"`
					PullPolicy string `json:"pullPolicy,omitempty"`
				} `json:"ratelimit"`
			} `json:"images"`
		} `json:"global"`
		Config struct {
			EnvoyGateway envoyGatewaySpec `json:"envoyGateway"`
		} `json:"config"`
	}
	decodeStrict(t, file, readFile(t, file), &values)
	// What the chart's "eg.ratelimit.image" helper renders
	// (charts/gateway-helm/templates/_helpers.tpl): registry, then
	// repository, then the tag, "master" when there is none.
	img := values.Global.Images.Ratelimit.Image
	registry, repoTag, _ := strings.Cut(img, "/")
	repo, tag, _ := strings.Cut(repoTag, ":")
	if tag == "" {
		tag = "master"
	}
	if rendered := registry + "/" + repo + ":" + tag; rendered != exampleImage {
		t.Errorf("global.images.ratelimit.image %q renders as %q, want %q", img, rendered, exampleImage)
	}
	checkEnvoyGateway(t, values.Config.EnvoyGateway, false)
}

// checkEnvoyGateway: Redis is the backend (EG renders no rate-limit
// Deployment without one), and, when withImage, the rate-limit container
// runs exampleImage and nothing replaces EG's own command, probes or
// security context.
func checkEnvoyGateway(t *testing.T, eg envoyGatewaySpec, withImage bool) {
	t.Helper()
	if rl := eg.RateLimit; rl == nil || rl.Backend.Type != "Redis" || rl.Backend.Redis == nil || rl.Backend.Redis.URL == nil || *rl.Backend.Redis.URL == "" {
		t.Errorf("rateLimit %+v, want backend type Redis with a url", eg.RateLimit)
	}
	if !withImage {
		return
	}
	if eg.Provider == nil || eg.Provider.Type != "Kubernetes" || eg.Provider.Kubernetes == nil {
		t.Fatalf("provider %+v, want type Kubernetes with kubernetes settings", eg.Provider)
	}
	k := eg.Provider.Kubernetes
	if k.RateLimitDeployment == nil || k.RateLimitDeployment.Container == nil || k.RateLimitDeployment.Container.Image == nil {
		t.Fatal("no provider.kubernetes.rateLimitDeployment.container.image")
	}
	c := k.RateLimitDeployment.Container
	if img := *c.Image; img != exampleImage || !egImage.MatchString(img) {
		t.Errorf("rate-limit image %q, want %q (and EG's image rule %s)", img, exampleImage, egImage)
	}
	if c.ImageRepository != nil {
		t.Error("both image and imageRepository: EG refuses them together")
	}
	if c.SecurityContext != nil || len(c.Env) > 0 || len(c.VolumeMounts) > 0 {
		t.Error("the container overrides EG's security context, environment or mounts: the swap should change only the image")
	}
	if p := k.RateLimitPDB; p != nil && (p.MinAvailable == nil) == (p.MaxUnavailable == nil) {
		t.Error("rateLimitPDB: EG wants exactly one of minAvailable and maxUnavailable")
	}
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
