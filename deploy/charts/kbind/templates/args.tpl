{{- define "kbind.schema-manager.args" -}}
- --leader-elect={{ .Values.schemaManager.leaderElect }}
- --leader-election-id={{ .Values.schemaManager.leaderElectionID }}
- --discovery-interval={{ .Values.schemaManager.discoveryInterval }}
- --binding-resync-interval={{ .Values.schemaManager.bindingResyncInterval }}
- --heartbeat-lease-duration={{ .Values.schemaManager.heartbeatLeaseDuration }}
- --autobind-grace-period={{ .Values.schemaManager.autobindGracePeriod }}
- --namespace-buckets={{ .Values.schemaManager.namespaceBuckets }}
- --related-resources={{ .Values.relatedResources.enabled }}
- --max-related-bindings-per-namespace={{ .Values.relatedResources.maxBindingsPerNamespace }}
{{ include "kbind.provider-secret-namespaces" . }}
{{- end -}}

{{- define "kbind.syncer.args" -}}
- --workers={{ .Values.syncer.workers }}
- --resync-interval={{ .Values.syncer.resyncInterval }}
- --membership-lease-duration={{ .Values.syncer.membershipLeaseDuration }}
{{ include "kbind.provider-secret-namespaces" . }}
{{- end -}}

{{/* Both programs refuse provider Secrets outside these namespaces (as the RBAC does), and
insecure transport to a provider unless allowed; both serve the same Bindings per namespace. */}}
{{- define "kbind.provider-secret-namespaces" -}}
- --provider-secret-namespaces={{ join "," (default (list .Release.Namespace) .Values.providerSecretNamespaces) }}
- --allow-insecure-providers={{ .Values.allowInsecureProviders | default false }}
- --metrics-auth={{ .Values.metrics.auth.enabled | default false }}
{{- end -}}

{{- define "kbind.schema-manager.affinity" -}}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Syncers spread across nodes unless the user sets an affinity. */}}
{{- define "kbind.syncer.affinity" -}}
affinity:
{{- if .values.affinity }}
  {{- toYaml .values.affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "kbind.selectorLabels" . | nindent 14 }}
{{- end }}
{{- end -}}
