{{/*
One component of kbind — its ServiceAccount, Deployment and PodDisruptionBudget — from
(dict "root" $ "component" "syncer" "values" .Values.syncer "cost" .Values.sizing.syncer): the two
Deployments differ only in their name, their values, their arguments (kbind.<component>.args) and
their affinity (kbind.<component>.affinity).
*/}}
{{- define "kbind.component" -}}
{{- $root := .root -}}
{{- $component := .component -}}
{{- $values := .values -}}
{{- $ctx := . -}}
{{- if $values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "kbind.serviceAccountName" $ctx }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kbind.labels" $root | nindent 4 }}
  {{- with $values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "kbind.fullname" $root }}-{{ $component }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kbind.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
spec:
  replicas: {{ $values.replicas }}
  selector:
    matchLabels:
      {{- include "kbind.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "kbind.selectorLabels" $ctx | nindent 8 }}
        {{- with $values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "kbind.serviceAccountName" $ctx }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ $component }}
          image: "{{ $values.image.repository }}:{{ $values.image.tag | default $root.Chart.AppVersion }}"
          imagePullPolicy: {{ $values.image.pullPolicy }}
          args:
            - --metrics-bind-address=:{{ $root.Values.metrics.port }}
            - --health-probe-bind-address=:{{ $root.Values.healthProbe.port }}
            - --log-format={{ $root.Values.logFormat }}
            - --log-level={{ $root.Values.logLevel }}
            {{- include (printf "kbind.%s.args" $component) $root | nindent 12 }}
            {{- range $values.extraArgs }}
            - {{ . }}
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            - name: POD_NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
            {{- /* A setting both programs share, as an environment variable (not a flag): a
            version that does not know it yet, run by this chart in a skewed upgrade, ignores it. */}}
            - name: KBIND_MAX_BINDINGS_PER_NAMESPACE
              value: {{ $root.Values.maxBindingsPerNamespace | quote }}
          ports:
            - {name: metrics, containerPort: {{ $root.Values.metrics.port }}, protocol: TCP}
            - {name: probe, containerPort: {{ $root.Values.healthProbe.port }}, protocol: TCP}
          livenessProbe:
            httpGet: {path: /healthz, port: probe}
            initialDelaySeconds: 15
            periodSeconds: 20
          readinessProbe:
            httpGet: {path: /readyz, port: probe}
            initialDelaySeconds: 5
            periodSeconds: 10
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          resources:
            {{- include "kbind.resources" $ctx | nindent 12 }}
      {{- with $values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- include (printf "kbind.%s.affinity" $component) $ctx | nindent 6 }}
{{- if $values.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "kbind.fullname" $root }}-{{ $component }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kbind.labels" $root | nindent 4 }}
spec:
  maxUnavailable: {{ $values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "kbind.selectorLabels" $ctx | nindent 6 }}
{{- end }}
{{- end -}}
