{{- define "kbind.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kbind.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kbind.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kbind.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "syncer") */}}
{{- define "kbind.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kbind.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The ServiceAccount name of a component: (dict "root" $ "component" "syncer" "values" .Values.syncer) */}}
{{- define "kbind.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (printf "%s-%s" (include "kbind.fullname" .root) .component) .values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Rules on the instances of the bound APIs. */}}
{{- define "kbind.boundRules" -}}
{{- if .groups }}
- apiGroups: {{ toJson .groups }}
  resources: ["*"]
  verbs: {{ toJson .verbs }}
{{- end }}
{{- end -}}
