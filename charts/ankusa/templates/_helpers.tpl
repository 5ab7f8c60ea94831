{{- define "ankusa.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ankusa.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "ankusa.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ankusa.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ankusa.labels" -}}
{{ include "ankusa.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "ankusa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ankusa.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- /* Cluster-scoped objects (the ClusterRole and its binding) carry the release's
namespace too: two installs of the same release name in different namespaces do not
collide. */ -}}
{{- define "ankusa.clusterScopedName" -}}
{{- printf "%s-%s" .Release.Namespace (include "ankusa.fullname" .) | trunc 253 | trimSuffix "-" }}
{{- end }}
