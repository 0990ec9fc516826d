{{/*
Chart name, shortened to the 63 characters a label value allows.
*/}}
{{- define "rbln-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name for the release's objects. The release name is used alone when it
contains the chart name or is a prefix of it, so `helm install k8s-device-plugin ...` names
the DaemonSet "k8s-device-plugin" rather than "k8s-device-plugin-k8s-device-plugin-chart".
*/}}
{{- define "rbln-device-plugin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if or (contains $name .Release.Name) (hasPrefix .Release.Name $name) }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rbln-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: must stay stable across upgrades, so no version in them.
*/}}
{{- define "rbln-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rbln-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rbln-device-plugin.labels" -}}
helm.sh/chart: {{ include "rbln-device-plugin.chart" . }}
{{ include "rbln-device-plugin.selectorLabels" . }}
app.kubernetes.io/version: {{ (default .Chart.AppVersion .Values.image.tag) | trunc 63 | quote }}
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
