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

{{/*
A component's resources: its own `resources` when set, else derived from `sizing`
(docs/operations.md, "Sizing"): (dict "root" $ "component" "syncer" "values" .Values.syncer "cost" .Values.sizing.syncer).
Memory request: base + its share of the objects × per object + the APIs × per API. A syncer's share
is objects / replicas; its limit holds objects / (replicas - 1), the share after taking over one
replica that is gone. The schema manager (one leader) holds every object and API; its limit is
its request plus half. CPU: a request only (measured: ~1.4 ms per object synced, ~3 ms per change,
docs/operations.md, "Sizing"), no limit.
*/}}
{{- define "kbind.resources" -}}
{{- if .values.resources -}}
{{- toYaml .values.resources -}}
{{- else -}}
{{- $sizing := .root.Values.sizing -}}
{{- $objects := int $sizing.objects -}}
{{- $apis := int $sizing.apis -}}
{{- $share := $objects -}}
{{- $held := $objects -}}
{{- $cpu := "50m" -}}
{{- if eq .component "syncer" -}}
{{- $replicas := max 1 (int .values.replicas) -}}
{{- $share = div (add $objects (sub $replicas 1)) $replicas -}}
{{- $survivors := max 1 (sub $replicas 1) -}}
{{- $held = div (add $objects (sub $survivors 1)) $survivors -}}
{{- $cpu = "100m" -}}
{{- end -}}
{{- $perApi := mul $apis (int .cost.perApiKiB) -}}
{{- $request := add (int .cost.baseMiB) (div (add (mul $share (int .cost.perObjectKiB)) $perApi 1023) 1024) -}}
{{- $limit := add (int .cost.baseMiB) (div (add (mul $held (int .cost.perObjectKiB)) $perApi 1023) 1024) -}}
{{- if ne .component "syncer" -}}
{{- $limit = add $request (div (add $request 1) 2) -}}
{{- else -}}
{{- $limit = add $limit (div (add $limit 3) 4) -}}
{{- end -}}
requests:
  cpu: {{ $cpu }}
  memory: {{ $request }}Mi
limits:
  memory: {{ $limit }}Mi
{{- end -}}
{{- end -}}
