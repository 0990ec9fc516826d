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

{{- define "rbln-device-plugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/*
A Go duration in seconds, e.g. "1m30s" -> 90. The schema has already checked the syntax.
Sprig's float helpers compute in decimal, so "24h", "1440m" and "86400000ms" all give 86400.
*/}}
{{- define "rbln-device-plugin.durationSeconds" -}}
{{- $factors := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1 "m" 60 "h" 3600 }}
{{- $total := 0.0 }}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" (toString .) -1 }}
{{- $unit := regexFind "(ns|us|µs|μs|ms|s|m|h)$" . }}
{{- $total = addf $total (mulf (trimSuffix $unit .) (get $factors $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Limits that involve arithmetic or more than one value, which JSON Schema cannot express. Each
failure names the value to change.
*/}}
{{- define "rbln-device-plugin.validate" -}}
{{- $plugin := .Values.devicePlugin }}
{{- $seconds := include "rbln-device-plugin.durationSeconds" $plugin.deviceScanInterval | float64 }}
{{- if gt $seconds 86400.0 }}
{{- fail (printf "devicePlugin.deviceScanInterval: %s is longer than 24h, the most the plugin accepts" $plugin.deviceScanInterval) }}
{{- end }}
{{- if not (gt $seconds 0.0) }}
{{- fail (printf "devicePlugin.deviceScanInterval: %s is not a positive duration" $plugin.deviceScanInterval) }}
{{- end }}
{{- $metrics := $plugin.metrics }}
{{- if and $metrics.otlp.enabled (not $plugin.otlpEndpoint) }}
{{- fail "devicePlugin.metrics.otlp.enabled: OTLP metrics need devicePlugin.otlpEndpoint (the collector)" }}
{{- end }}
{{- $export := include "rbln-device-plugin.durationSeconds" $metrics.otlp.exportInterval | float64 }}
{{- if or (gt $export 86400.0) (not (gt $export 0.0)) }}
{{- fail (printf "devicePlugin.metrics.otlp.exportInterval: %s is not a positive duration of at most 24h" $metrics.otlp.exportInterval) }}
{{- end }}
{{- if and $metrics.service.enabled (not $metrics.prometheus.enabled) }}
{{- fail "devicePlugin.metrics.service.enabled: the Service needs devicePlugin.metrics.prometheus.enabled" }}
{{- end }}
{{- if and $metrics.serviceMonitor.enabled (not $metrics.service.enabled) }}
{{- fail "devicePlugin.metrics.serviceMonitor.enabled: the ServiceMonitor needs devicePlugin.metrics.service.enabled" }}
{{- end }}
{{- if and $metrics.prometheus.enabled (eq (int $metrics.prometheus.port) (int $plugin.containers.plugin.healthcheckPort)) }}
{{- fail (printf "devicePlugin.metrics.prometheus.port: %d is already the health port (devicePlugin.containers.plugin.healthcheckPort)" (int $metrics.prometheus.port)) }}
{{- end }}
{{- $interval := include "rbln-device-plugin.durationSeconds" $metrics.serviceMonitor.interval | float64 }}
{{- $timeout := include "rbln-device-plugin.durationSeconds" $metrics.serviceMonitor.scrapeTimeout | float64 }}
{{- if gt $timeout $interval }}
{{- fail (printf "devicePlugin.metrics.serviceMonitor.scrapeTimeout: %s is longer than the interval %s" $metrics.serviceMonitor.scrapeTimeout $metrics.serviceMonitor.interval) }}
{{- end }}
{{- $taken := dict "/dev" "the /dev mount" "/run/rbln" "the /run/rbln mount" "/host/usr/bin" "the host /usr/bin mount" }}
{{- range $key := list "kubeletDevicePluginPath" "cdiRoot" }}
{{- $path := clean (get $plugin $key) }}
{{- if hasKey $taken $path }}
{{- fail (printf "devicePlugin.%s: %s is already used by %s; pick another directory" $key $path (get $taken $path)) }}
{{- end }}
{{- $_ := set $taken $path (printf "devicePlugin.%s" $key) }}
{{- end }}
{{- end }}
