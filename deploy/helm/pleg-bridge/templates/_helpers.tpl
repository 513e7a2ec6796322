{{/* The chart's name, or nameOverride. */}}
{{- define "pleg-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it contains
the chart's name (so release "pleg-bridge" gives "pleg-bridge", as in
deploy/kubernetes), else <release>-<name>.
*/}}
{{- define "pleg-bridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pleg-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pleg-bridge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The pods' selector: immutable once installed. */}}
{{- define "pleg-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pleg-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Every object's labels. The Helm-only ones (helm.sh/chart, instance,
version, managed-by) are the only difference from deploy/kubernetes with
default values; cmd/pleg-bridge/helm_test.go holds the two together.
*/}}
{{- define "pleg-bridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pleg-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ include "pleg-bridge.tag" . | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "pleg-bridge.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* registry/repository:tag, or @digest when image.digest is set. */}}
{{- define "pleg-bridge.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repo = printf "%s/%s" .Values.image.registry .Values.image.repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (include "pleg-bridge.tag" .) }}
{{- end }}
{{- end }}

{{/* The CRI socket path: criSocket, checked. */}}
{{- define "pleg-bridge.criSocket" -}}
{{- if not (hasPrefix "/" .Values.criSocket) }}
{{- fail (printf "criSocket must be an absolute path to the runtime's unix socket, got %q" .Values.criSocket) }}
{{- end }}
{{- .Values.criSocket }}
{{- end }}
