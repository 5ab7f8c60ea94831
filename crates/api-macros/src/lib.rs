//! `#[answers]`, put above a handler's `#[utoipa::path(…)]`: the success responses of the
//! path (each `(status = 2xx, …)` of its `responses(…)`) get `body = T`, `T` read from the
//! handler's return type — `Json<T>`, `(StatusCode, Json<T>)`, either inside a `Result`.
//! A success response that names a body itself is a compile error, as is a handler that
//! does not return `Json<T>`: the document's body and the handler's cannot differ.
//!
//! ```
//! # use ankusa_api_macros::answers;
//! # #[derive(serde::Serialize, utoipa::ToSchema)]
//! # struct Page { n: u32 }
//! # struct Json<T>(T);
//! #[answers]
//! #[utoipa::path(get, path = "/page", responses((status = 200, description = "A page")))]
//! async fn page() -> Result<Json<Page>, String> {
//!     Ok(Json(Page { n: 1 }))
//! }
//! ```
//!
//! A success that names its body is refused, even the right one:
//!
//! ```compile_fail
//! # use ankusa_api_macros::answers;
//! # #[derive(serde::Serialize, utoipa::ToSchema)]
//! # struct Page { n: u32 }
//! # struct Json<T>(T);
//! #[answers]
//! #[utoipa::path(get, path = "/page", responses((status = 200, description = "A page", body = Page)))]
//! async fn page() -> Json<Page> {
//!     Json(Page { n: 1 })
//! }
//! ```
//!
//! And so is a handler that answers something else than `Json<T>`:
//!
//! ```compile_fail
//! # use ankusa_api_macros::answers;
//! #[answers]
//! #[utoipa::path(get, path = "/page", responses((status = 200, description = "A page")))]
//! async fn page() -> String {
//!     String::new()
//! }
//! ```

use proc_macro::TokenStream;
use proc_macro2::{Delimiter, Group, TokenStream as Tokens, TokenTree};
use quote::{quote, ToTokens};
use syn::spanned::Spanned;
use syn::{GenericArgument, ItemFn, PathArguments, ReturnType, Type};

#[proc_macro_attribute]
pub fn answers(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return error(Tokens::from(attr).span(), "#[answers] takes no arguments");
    }
    let mut f = match syn::parse::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    let body = match &f.sig.output {
        ReturnType::Type(_, ty) => json_body(ty),
        ReturnType::Default => None,
    };
    let Some(body) = body.cloned() else {
        return error(
            f.sig.output.span(),
            "a handler under #[answers] returns Json<T> (or (StatusCode, Json<T>), in a Result or not)",
        );
    };
    let Some(path) = f.attrs.iter_mut().find(|a| {
        let p = a.path();
        p.segments.len() == 2 && p.segments[0].ident == "utoipa" && p.segments[1].ident == "path"
    }) else {
        return error(
            f.sig.ident.span(),
            "#[answers] goes above a #[utoipa::path(…)]",
        );
    };
    let syn::Meta::List(list) = &mut path.meta else {
        return error(path.span(), "#[utoipa::path(…)] has a list");
    };
    match with_body(list.tokens.clone(), &body) {
        Ok(tokens) => list.tokens = tokens,
        Err((span, why)) => return error(span, why),
    }
    f.into_token_stream().into()
}

fn error(span: proc_macro2::Span, why: &str) -> TokenStream {
    syn::Error::new(span, why).to_compile_error().into()
}

/// `T` of `Json<T>`, looked for through `Result<_, _>`'s first argument and a tuple's
/// elements.
fn json_body(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Tuple(t) => t.elems.iter().find_map(json_body),
        Type::Paren(p) => json_body(&p.elem),
        Type::Path(p) => {
            let last = p.path.segments.last()?;
            let PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            let first = args.args.iter().find_map(|a| match a {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })?;
            match last.ident.to_string().as_str() {
                "Json" => Some(first),
                "Result" => json_body(first),
                _ => None,
            }
        }
        _ => None,
    }
}

type Refusal = (proc_macro2::Span, &'static str);

/// The attribute's tokens with `body = T` added to each success response of `responses(…)`.
fn with_body(tokens: Tokens, body: &Type) -> Result<Tokens, Refusal> {
    let mut out = Vec::new();
    let mut iter = tokens.into_iter().peekable();
    let mut found = false;
    while let Some(tt) = iter.next() {
        let is_responses = matches!(&tt, TokenTree::Ident(i) if i == "responses");
        out.push(tt);
        if !is_responses {
            continue;
        }
        let Some(TokenTree::Group(g)) = iter.next() else {
            continue;
        };
        let (inner, n) = success_bodies(g.stream(), body)?;
        if n == 0 {
            return Err((
                g.span(),
                "responses(…) has no (status = 2xx, …) for the handler's body",
            ));
        }
        found = true;
        let mut group = Group::new(g.delimiter(), inner);
        group.set_span(g.span());
        out.push(TokenTree::Group(group));
    }
    if !found {
        return Err((
            proc_macro2::Span::call_site(),
            "#[utoipa::path(…)] has no responses(…)",
        ));
    }
    Ok(out.into_iter().collect())
}

/// Inside `responses(…)`: each parenthesised response whose status is 2xx gets the body.
fn success_bodies(tokens: Tokens, body: &Type) -> Result<(Tokens, usize), Refusal> {
    let mut out = Tokens::new();
    let mut n = 0;
    for tt in tokens {
        match tt {
            TokenTree::Group(g) if g.delimiter() == Delimiter::Parenthesis && is_success(&g) => {
                if g.stream()
                    .into_iter()
                    .any(|t| matches!(&t, TokenTree::Ident(i) if i == "body"))
                {
                    return Err((g.span(), "the body of a success comes from the handler's return type: leave `body = …` out"));
                }
                let inner = g.stream();
                let mut group = Group::new(Delimiter::Parenthesis, quote!(#inner, body = #body));
                group.set_span(g.span());
                out.extend([TokenTree::Group(group)]);
                n += 1;
            }
            other => out.extend([other]),
        }
    }
    Ok((out, n))
}

/// `(status = 2xx, …)`.
fn is_success(g: &Group) -> bool {
    let t: Vec<TokenTree> = g.stream().into_iter().take(3).collect();
    match t.as_slice() {
        [TokenTree::Ident(s), TokenTree::Punct(eq), TokenTree::Literal(code)] => {
            s == "status" && eq.as_char() == '=' && code.to_string().starts_with('2')
        }
        _ => false,
    }
}
