// A typed client of two Client API operations, written against the types
// openapi-typescript generates from ../openapi.yaml. tsc checks it
// (api/typescript_test.go); a change of the description that breaks it
// fails the build.
import type { components, operations, paths } from "./generated/client-api";

type StatusAnswer =
  paths["/api/v2/status"]["get"]["responses"][200]["content"]["application/json"];
type Fail = components["schemas"]["V2Fail"];
type Secret = components["schemas"]["Secret"];
type SecretsQuery = operations["getSecrets"]["parameters"]["query"];

// getStatus fetches GET /api/v2/status and returns the state code.
export async function getStatus(base: string): Promise<1 | 2 | 3> {
  const res = await fetch(`${base}/api/v2/status`);
  const body = (await res.json()) as StatusAnswer | Fail;
  if (body.status !== "success") {
    throw new Error(`status: HTTP ${res.status}: ${body.message}`);
  }
  return body.data.code;
}

// getSecrets fetches GET /api/v2/secrets?s=...; the caller's TLS client
// certificate (mutual TLS) is set up outside fetch.
export async function getSecrets(base: string, query: SecretsQuery): Promise<Record<string, Secret>> {
  const params = new URLSearchParams();
  for (const name of query.s) params.append("s", name);
  const res = await fetch(`${base}/api/v2/secrets?${params}`);
  type Answer =
    operations["getSecrets"]["responses"][200]["content"]["application/json"];
  const body = (await res.json()) as Answer | Fail;
  if (body.status === "fail") {
    const where = body.data && "section" in body.data ? ` (${body.data.section})` : "";
    throw new Error(`secrets: HTTP ${res.status}: ${body.message}${where}`);
  }
  return body.data.secrets;
}

// A manifest set request, typed: base64 of the manifest's bytes.
export const setManifestBody: components["schemas"]["ManifestRequest"] = {
  manifest: btoa(JSON.stringify({ Packages: {}, Marbles: {} })),
};
