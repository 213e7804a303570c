{{/* Name of the chart, or nameOverride. */}}
{{- define "quarry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: the release name with the chart's, or fullnameOverride. */}}
{{- define "quarry.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "quarry.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "quarry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "quarry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quarry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end }}

{{/* The certificates' names: the values, else the Services' names. */}}
{{- define "quarry.dnsNames" -}}
{{- if .Values.coordinator.dnsNames }}
{{- join "," .Values.coordinator.dnsNames }}
{{- else }}
{{- $f := include "quarry.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list }}
{{- range $svc := list $f (printf "%s-mesh" $f) }}
{{- $names = append $names $svc }}
{{- $names = append $names (printf "%s.%s" $svc $ns) }}
{{- $names = append $names (printf "%s.%s.svc" $svc $ns) }}
{{- $names = append $names (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- end }}
{{- $names = append $names "localhost" }}
{{- join "," $names }}
{{- end }}
{{- end }}

{{/* Settings the chart sets itself; coordinator.env must not repeat them. */}}
{{- define "quarry.managedEnv" -}}
EDG_COORDINATOR_CLIENT_ADDR EDG_COORDINATOR_MESH_ADDR EDG_COORDINATOR_PROMETHEUS_ADDR EDG_COORDINATOR_DNS_NAMES EDG_COORDINATOR_SEAL_DIR EDG_DEBUG_LOGGING EDG_COORDINATOR_DEV_MODE QUARRY_ATTESTATION QUARRY_STORE QUARRY_ETCD_ENDPOINTS QUARRY_ETCD_PREFIX QUARRY_ETCD_CA QUARRY_ETCD_CERT QUARRY_ETCD_KEY QUARRY_INSECURE_PEER_TRUST QUARRY_PEER_ADDR QUARRY_PEER_ADVERTISE_ADDR QUARRY_ETCD_COMPACTION QUARRY_ETCD_COMPACTION_RETENTION POD_IP
{{- end }}

{{/* The Marble injector's name and labels. */}}
{{- define "quarry.injectorName" -}}
{{- printf "%s-injector" (include "quarry.fullname" .) }}
{{- end }}

{{- define "quarry.injectorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "quarry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: marble-injector
{{- end }}

{{- define "quarry.injectorLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "quarry.injectorSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
