{{- define "kbind-reaper.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kbind-reaper.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kbind-reaper.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: reaper
{{- end -}}

{{- define "kbind-reaper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kbind-reaper.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The verbs on a dead consumer's objects the action needs: list only, unless it acts. */}}
{{- define "kbind-reaper.verbs" -}}
{{- if eq .Values.action "Delete" -}}
["list", "delete"]
{{- else if eq .Values.action "Orphan" -}}
["list", "patch"]
{{- else if or (eq .Values.action "Report") (eq .Values.action "Revoke") -}}
["list"]
{{- else -}}
{{- fail (printf "action must be Report, Revoke, Orphan or Delete, not %q" .Values.action) -}}
{{- end -}}
{{- end -}}
