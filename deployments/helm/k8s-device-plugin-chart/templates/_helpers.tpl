{{/*
Chart name, shortened to the 63 characters a label value allows.
*/}}
{{- define "rbln-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the DaemonSet and ServiceAccount. Like the Go plugin's chart it does not depend on the
release name, so `helm upgrade` from that chart updates the same objects in place.
*/}}
{{- define "rbln-device-plugin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- include "rbln-device-plugin.name" . }}
{{- end }}
{{- end }}

{{- define "rbln-device-plugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "rbln-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: the same keys as the Go plugin's chart (a DaemonSet's selector cannot change
on upgrade), plus selectorLabelsOverride. No version in them.
*/}}
{{- define "rbln-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rbln-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- with .Values.selectorLabelsOverride }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "rbln-device-plugin.labels" -}}
helm.sh/chart: {{ include "rbln-device-plugin.chart" . }}
{{ include "rbln-device-plugin.selectorLabels" . }}
app.kubernetes.io/version: {{ (default .Chart.AppVersion .Values.image.tag) | toString | trunc 63 | quote }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rbln-device-plugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rbln-device-plugin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
What the DaemonSet serves: "device-plugin" (the default) or "dra". The schema allows only
these two words.
*/}}
{{- define "rbln-device-plugin.mode" -}}
{{- .Values.mode | default "device-plugin" }}
{{- end }}

{{/*
The driver's name in ResourceSlices and DeviceClasses: Rebellions' DRA driver's, so claims
written for that driver work with this one.
*/}}
{{- define "rbln-device-plugin.draDriver" -}}
npu.rebellions.ai
{{- end }}

{{/*
The ClusterRole and ClusterRoleBinding of dra mode. Cluster-scoped, so the name carries the
namespace as well: two installations in different namespaces do not take each other's.
*/}}
{{- define "rbln-device-plugin.clusterRoleName" -}}
{{- printf "%s:%s" (include "rbln-device-plugin.namespace" .) (include "rbln-device-plugin.fullname" .) }}
{{- end }}

{{- define "rbln-device-plugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/*
A Go duration in seconds, e.g. "1m30s" -> 90. The schema has already checked the syntax.
Sprig's float helpers compute in decimal, so "24h", "1440m" and "86400000ms" all give 86400.
Each term is cut to whole nanoseconds, as time.ParseDuration cuts it: ".1ns" is 0.
*/}}
{{- define "rbln-device-plugin.durationSeconds" -}}
{{- $factors := dict "ns" 1 "us" 1000 "µs" 1000 "μs" 1000 "ms" 1000000 "s" 1000000000 "m" 60000000000 "h" 3600000000000 }}
{{- $total := 0.0 }}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" (toString .) -1 }}
{{- $unit := regexFind "(ns|us|µs|μs|ms|s|m|h)$" . }}
{{- $total = addf $total (floor (mulf (trimSuffix $unit .) (get $factors $unit))) }}
{{- end }}
{{- divf $total 1000000000 }}
{{- end }}

{{/*
What the plugin would refuse at start (values.schema.json only checks types: its errors
would print the patterns, these say what is wrong in words). Each failure names the value
to change. Also the limits that involve arithmetic or more than one value.
*/}}
{{- define "rbln-device-plugin.validate" -}}
{{- $plugin := .Values.devicePlugin }}
{{- $dra := eq (include "rbln-device-plugin.mode" .) "dra" }}
{{- if and (not $dra) (eq ($plugin.draTaintNoExecute | default false) true) }}
{{- fail "devicePlugin.draTaintNoExecute taints devices in ResourceSlices, which only mode dra publishes: set mode dra or leave it false" }}
{{- end }}
{{- if $dra }}
{{- if semverCompare "<1.34.0-0" .Capabilities.KubeVersion.Version }}
{{- fail (printf "mode dra needs Kubernetes 1.34 or later (resource.k8s.io/v1 DeviceClasses and ResourceSlices); this cluster is %s: use mode device-plugin" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if eq ($plugin.surgeHandover | default false) true }}
{{- fail "devicePlugin.surgeHandover is a hand-over between two device-plugin registrations; mode dra registers one DRA plugin under fixed socket names: leave surgeHandover false" }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "mode dra binds its ClusterRole to the plugin's ServiceAccount: with serviceAccount.create=false, give serviceAccount.name (the namespace's \"default\" account is not bound)" }}
{{- end }}
{{- $draDirs := dict "kubeletPluginsRegistryPath" (dig "kubeletPluginsRegistryPath" "/var/lib/kubelet/plugins_registry" $plugin) "kubeletPluginsPath" (dig "kubeletPluginsPath" "/var/lib/kubelet/plugins" $plugin) }}
{{- $draExamples := dict "kubeletPluginsRegistryPath" "/var/lib/kubelet/plugins_registry" "kubeletPluginsPath" "/var/lib/kubelet/plugins" }}
{{- /* The longest names the plugin puts there: "/npu.rebellions.ai-reg.sock" and
"/npu.rebellions.ai/dra.sock", 27 bytes each, within a unix socket path's 107. */}}
{{- range $key := list "kubeletPluginsRegistryPath" "kubeletPluginsPath" }}
{{- $path := toString (get $draDirs $key) }}
{{- if not (hasPrefix "/" $path) }}
{{- fail (printf "devicePlugin.%s: %q is not an absolute path; give the host directory, such as %s" $key $path (get $draExamples $key)) }}
{{- end }}
{{- if regexMatch "(^|/)\\.\\.(/|$)" $path }}
{{- fail (printf "devicePlugin.%s: %q contains '..'; give the directory itself" $key $path) }}
{{- end }}
{{- if contains "\x00" $path }}
{{- fail (printf "devicePlugin.%s: the path contains a NUL character" $key) }}
{{- end }}
{{- if gt (len $path) 80 }}
{{- fail (printf "devicePlugin.%s: %d characters is too long; at most 80 leave room for the plugin's socket names within the 107-byte unix socket limit" $key (len $path)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq ($plugin.surgeHandover | default false) true }}
{{- $strategy := $plugin.updateStrategy | default dict }}
{{- if or (hasKey $strategy "rollingUpdate") (eq (toString ($strategy.type | default "RollingUpdate")) "OnDelete") }}
{{- fail "devicePlugin.surgeHandover sets the update strategy itself (RollingUpdate, maxSurge 1, maxUnavailable 0): leave devicePlugin.updateStrategy at its default" }}
{{- end }}
{{- if gt (len $plugin.kubeletDevicePluginPath) 56 }}
{{- fail (printf "devicePlugin.surgeHandover: devicePlugin.kubeletDevicePluginPath %q is longer than 56 characters, which leaves no room for a successor's socket names (unix socket paths are limited to 107 bytes)" $plugin.kubeletDevicePluginPath) }}
{{- end }}
{{- if le (int $plugin.containers.plugin.healthcheckPort) 0 }}
{{- fail "devicePlugin.surgeHandover needs the health service (containers.plugin.healthcheckPort): its readiness probe tells when the new pod serves" }}
{{- end }}
{{- end }}
{{- /* The Go chart's image would run the Go plugin with this chart's probes: its health
service has no "readiness", so no pod would ever turn ready. */}}
{{- if regexMatch "^((docker\\.io|index\\.docker\\.io|registry-1\\.docker\\.io)/)?rebellions/k8s-device-plugin$" (toString .Values.image.repository) }}
{{- fail (printf "image.repository: %s is the Go plugin's image, which never turns ready under this chart's readiness probe; set image.repository (and image.tag) to this plugin's image where it was pushed, e.g. <registry>/k8s-device-plugin (make -f deployments/container/Makefile build IMAGE_NAME=<registry>/k8s-device-plugin PUSH_ON_BUILD=true)" .Values.image.repository) }}
{{- end }}
{{- $interval := $plugin.deviceScanInterval }}
{{- /* Empty or null: the plugin's default, as a Go values file without the key gets. */}}
{{- if not (include "rbln-device-plugin.unset" $interval) }}
{{- if not (kindIs "string" $interval) }}
{{- fail (printf "devicePlugin.deviceScanInterval: %v is a number, but the plugin needs a Go duration with a unit, such as %vs or %vms (use --set-string, or quotes in a values file)" $interval $interval $interval) }}
{{- end }}
{{- if not (regexMatch "^\\+?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$" $interval) }}
{{- fail (printf "devicePlugin.deviceScanInterval: %q is not a Go duration: write numbers with units (ns, us, ms, s, m, h), such as 500ms, 5s or 1m30s" $interval) }}
{{- end }}
{{- $seconds := include "rbln-device-plugin.durationSeconds" $interval | float64 }}
{{- if gt $seconds 86400.0 }}
{{- fail (printf "devicePlugin.deviceScanInterval: %s is longer than 24h, the most the plugin accepts" $interval) }}
{{- end }}
{{- if not (gt $seconds 0.0) }}
{{- fail (printf "devicePlugin.deviceScanInterval: %s is not a positive duration" $interval) }}
{{- end }}
{{- end }}
{{- $examples := dict "kubeletDevicePluginPath" "/var/lib/kubelet/device-plugins" "cdiRoot" "/var/run/cdi" "cdiStaticDir" "/etc/cdi" }}
{{- $hostDirs := dict "kubeletDevicePluginPath" $plugin.kubeletDevicePluginPath "cdiRoot" $plugin.cdiRoot "cdiStaticDir" (dig "cdiStaticDir" "/etc/cdi" $plugin) }}
{{- range $key := list "kubeletDevicePluginPath" "cdiRoot" "cdiStaticDir" }}
{{- $path := toString (get $hostDirs $key) }}
{{- if not (hasPrefix "/" $path) }}
{{- fail (printf "devicePlugin.%s: %q is not an absolute path; give the host directory, such as %s" $key $path (get $examples $key)) }}
{{- end }}
{{- if regexMatch "(^|/)\\.\\.(/|$)" $path }}
{{- fail (printf "devicePlugin.%s: %q contains '..'; give the directory itself" $key $path) }}
{{- end }}
{{- if contains "\x00" $path }}
{{- fail (printf "devicePlugin.%s: the path contains a NUL character" $key) }}
{{- end }}
{{- end }}
{{- if gt (len $plugin.kubeletDevicePluginPath) 61 }}
{{- fail (printf "devicePlugin.kubeletDevicePluginPath: %d characters is too long; at most 61 leave room for the plugin's socket names within the 107-byte unix socket limit" (len $plugin.kubeletDevicePluginPath)) }}
{{- end }}
{{- with $plugin.otlpEndpoint }}
{{- $host := "(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9]([-A-Za-z0-9._]*[A-Za-z0-9])?)" }}
{{- $port := "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])" }}
{{- $url := printf "^(https?|grpcs?)://%s(:%s)?/?$" $host $port }}
{{- $hostPort := printf "^%s:%s$" $host $port }}
{{- if not (or (regexMatch $url .) (regexMatch $hostPort .)) }}
{{- fail (printf "devicePlugin.otlpEndpoint: %q is neither host:port (port 1-65535, no TLS) nor a URL http(s)://host[:port] or grpc(s)://host[:port] without a path; for example otel-collector.observability:4317" .) }}
{{- end }}
{{- end }}
{{- $container := $plugin.containers.plugin }}
{{- range $kind, $quantities := ($container.resources | default dict) }}
{{- if has $kind (list "limits" "requests") }}
{{- range $resource, $quantity := $quantities }}
{{- if not (regexMatch "^[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$" (toString $quantity)) }}
{{- fail (printf "devicePlugin.containers.plugin.resources.%s.%s: %q is not a Kubernetes quantity (such as 256Mi, 1Gi, 500m or 2)" $kind $resource (toString $quantity)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $container.extraEnv }}
{{- if and (has .name (list "SYSFS_ROOT" "DEV_ROOT" "RSD_LOCK_PATH")) (hasKey . "value") }}
{{- if or (not (regexMatch "[!-~]" (toString .value))) (contains "\x00" (toString .value)) }}
{{- fail (printf "devicePlugin.containers.plugin.extraEnv: %s is blank; give a path, or leave the entry out for the plugin's default" .name) }}
{{- end }}
{{- end }}
{{- if and (eq .name "RSD_LOCK_PATH") (hasKey . "value") }}
{{- $lockPath := toString .value }}
{{- $parts := splitList "/" $lockPath }}
{{- $named := without $parts "" "." }}
{{- if or (not (hasPrefix "/" $lockPath)) (has ".." $parts) (lt (len $named) 2) (hasSuffix "/" $lockPath) (hasSuffix "/." $lockPath) }}
{{- fail (printf "devicePlugin.containers.plugin.extraEnv: RSD_LOCK_PATH %q is not a lock file's path: give an absolute path without '..' to a file in a directory below the root, such as /run/rbln/rsd-group.lock (the plugin makes the file and its instance lock beside it)" $lockPath) }}
{{- end }}
{{- end }}
{{- end }}
{{- $cdiMode := dig "cdiMode" "annotation" $plugin }}
{{- if not (has $cdiMode (list "annotation" "field" "both")) }}
{{- fail (printf "devicePlugin.cdiMode: %q is not a CDI mode: annotation (the cdi.k8s.io annotation, as the Go plugin), field (the kubelet's cdi_devices: Kubernetes 1.29+, or 1.28 with the DevicePluginCDIDevices feature gate on) or both" (toString $cdiMode)) }}
{{- end }}
{{- $metrics := $plugin.metrics }}
{{- if and $metrics.otlp.enabled (not $plugin.otlpEndpoint) }}
{{- fail "devicePlugin.metrics.otlp.enabled: OTLP metrics need devicePlugin.otlpEndpoint (the collector)" }}
{{- end }}
{{- if not (include "rbln-device-plugin.unset" $metrics.otlp.exportInterval) }}
{{- $export := include "rbln-device-plugin.durationSeconds" $metrics.otlp.exportInterval | float64 }}
{{- if or (gt $export 86400.0) (lt $export 1.0) }}
{{- fail (printf "devicePlugin.metrics.otlp.exportInterval: %s is not a duration from 1s to 24h" $metrics.otlp.exportInterval) }}
{{- end }}
{{- end }}
{{- if and $metrics.service.enabled (not $metrics.prometheus.enabled) }}
{{- fail "devicePlugin.metrics.service.enabled: the Service needs devicePlugin.metrics.prometheus.enabled" }}
{{- end }}
{{- if and $metrics.serviceMonitor.enabled (not $metrics.service.enabled) }}
{{- fail "devicePlugin.metrics.serviceMonitor.enabled: the ServiceMonitor needs devicePlugin.metrics.service.enabled" }}
{{- end }}
{{- $metricsPort := int (include "rbln-device-plugin.metricsPort" .) }}
{{- if and $metrics.prometheus.enabled (eq $metricsPort (int (include "rbln-device-plugin.healthPort" .))) }}
{{- fail (printf "devicePlugin.metrics.prometheus.port: %d is already the health port (devicePlugin.containers.plugin.healthcheckPort)" $metricsPort) }}
{{- end }}
{{- $interval := include "rbln-device-plugin.durationSeconds" $metrics.serviceMonitor.interval | float64 }}
{{- $timeout := include "rbln-device-plugin.durationSeconds" $metrics.serviceMonitor.scrapeTimeout | float64 }}
{{- if gt $timeout $interval }}
{{- fail (printf "devicePlugin.metrics.serviceMonitor.scrapeTimeout: %s is longer than the interval %s" $metrics.serviceMonitor.scrapeTimeout $metrics.serviceMonitor.interval) }}
{{- end }}
{{- $taken := dict "/dev" "the /dev mount" "/run/rbln" "the /run/rbln mount" "/host/usr/bin" "the host /usr/bin mount" }}
{{- $mounted := list "kubeletDevicePluginPath" "cdiRoot" "cdiStaticDir" }}
{{- if $dra }}
{{- /* dra mode mounts the kubelet's plugin directories instead of the device-plugin one. */}}
{{- $mounted = list "kubeletPluginsRegistryPath" "kubeletPluginsPath" "cdiRoot" "cdiStaticDir" }}
{{- $_ := set $hostDirs "kubeletPluginsRegistryPath" (dig "kubeletPluginsRegistryPath" "/var/lib/kubelet/plugins_registry" $plugin) }}
{{- $_ := set $hostDirs "kubeletPluginsPath" (dig "kubeletPluginsPath" "/var/lib/kubelet/plugins" $plugin) }}
{{- end }}
{{- range $key := $mounted }}
{{- $path := clean (get $hostDirs $key) }}
{{- if and (eq $key "cdiStaticDir") (eq $path (clean $plugin.cdiRoot)) }}
{{- continue }}{{/* one directory: the cdi-root mount serves both */}}
{{- end }}
{{- if hasKey $taken $path }}
{{- fail (printf "devicePlugin.%s: %s is already used by %s; pick another directory" $key $path (get $taken $path)) }}
{{- end }}
{{- $_ := set $taken $path (printf "devicePlugin.%s" $key) }}
{{- end }}
{{- $volumes := dict "device-plugin" "the chart" "cdi-root" "the chart" "dev" "the chart" "run-rbln" "the chart" "host-usr-bin" "the chart" }}
{{- if $dra }}
{{- $_ := set $volumes "plugins-registry" "the chart" }}
{{- $_ := set $volumes "plugins" "the chart" }}
{{- end }}
{{- range ($plugin.extraVolumes | default list) }}
{{- if hasKey $volumes .name }}
{{- fail (printf "devicePlugin.extraVolumes: the volume name %s is already used by %s; pick another name" .name (get $volumes .name)) }}
{{- end }}
{{- $_ := set $volumes .name "devicePlugin.extraVolumes" }}
{{- end }}
{{- range ($plugin.containers.plugin.extraVolumeMounts | default list) }}
{{- if not (eq (get $volumes .name) "devicePlugin.extraVolumes") }}
{{- fail (printf "devicePlugin.containers.plugin.extraVolumeMounts: %s names no volume in devicePlugin.extraVolumes" .name) }}
{{- end }}
{{- if or (not (hasPrefix "/" .mountPath)) (has ".." (splitList "/" .mountPath)) }}
{{- fail (printf "devicePlugin.containers.plugin.extraVolumeMounts: %q is not an absolute path without '..'" .mountPath) }}
{{- end }}
{{- if hasKey $taken (clean .mountPath) }}
{{- fail (printf "devicePlugin.containers.plugin.extraVolumeMounts: %s is already used by %s; pick another directory" (clean .mountPath) (get $taken (clean .mountPath))) }}
{{- end }}
{{- $_ := set $taken (clean .mountPath) (printf "the extra mount of %s" .name) }}
{{- end }}
{{- end }}

{{/*
"true" when a value is empty or null, else nothing. Such a value of a setting the plugin reads
from a variable means the plugin's default, as an empty variable does for the Go plugin
(urfave/cli skips it).
*/}}
{{- define "rbln-device-plugin.unset" -}}
{{- if or (kindIs "invalid" .) (eq (toString .) "") }}true{{ end }}
{{- end }}

{{/*
The port the health server listens on: healthcheckPort, or the plugin's default (51515) when
it is empty, as HEALTHCHECK_PORT="" gives.
*/}}
{{- define "rbln-device-plugin.healthPort" -}}
{{- $port := .Values.devicePlugin.containers.plugin.healthcheckPort }}
{{- if include "rbln-device-plugin.unset" $port }}51515{{ else }}{{ int $port }}{{ end }}
{{- end }}

{{/*
The metrics endpoint's port when it is on (the chart's 9464 when the value is empty), else -1.
*/}}
{{- define "rbln-device-plugin.metricsPort" -}}
{{- $prometheus := (.Values.devicePlugin.metrics | default dict).prometheus | default dict }}
{{- if eq ($prometheus.enabled | default false) true }}{{ int ($prometheus.port | default 9464) }}{{ else }}-1{{ end }}
{{- end }}
