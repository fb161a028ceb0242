//! Users and privileges: `CREATE USER`, `ALTER USER`, `DROP USER`, `GRANT` and `REVOKE`.

use datafusion::sql::sqlparser::keywords::Keyword;

use datafusion::sql::sqlparser::tokenizer::Token;
use nyala_engine::Privilege;

use crate::parse::parser::NyalaParser;

use crate::parse::statement::{normalize_ident, object_name, Ddl, Secret};
use crate::Result;

impl NyalaParser<'_> {
    /// `CREATE USER [IF NOT EXISTS] name [WITH] PASSWORD 'p'`, `ALTER USER name [WITH] PASSWORD
    /// 'p'`, `DROP USER [IF EXISTS] name`.
    pub(super) fn parse_user_statement(&mut self) -> Result<Ddl> {
        let verb = self
            .parser
            .next_token()
            .token
            .to_string()
            .to_ascii_uppercase();
        self.parser.next_token(); // USER
        let if_exists = match verb.as_str() {
            "CREATE" => self
                .parser
                .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]),
            "DROP" => self.parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]),
            _ => false,
        };
        let name = normalize_ident(&self.parser.parse_identifier()?);
        if verb == "DROP" {
            return Ok(Ddl::DropUser { name, if_exists });
        }
        let _ = self.parser.parse_keyword(Keyword::WITH);
        if !self.parse_word("PASSWORD") {
            return Err(self.unexpected("PASSWORD 'password'"));
        }
        let password = Secret(self.parser.parse_literal_string()?);
        Ok(match verb.as_str() {
            "CREATE" => Ddl::CreateUser {
                name,
                password,
                if_not_exists: if_exists,
            },
            _ => Ddl::AlterUser { name, password },
        })
    }

    /// `GRANT privileges ON [TABLE] object TO user` or `REVOKE privileges ON [TABLE] object
    /// FROM user`; privileges: `ALL [PRIVILEGES]` or a list of SELECT, INSERT, UPDATE, DELETE.
    pub(super) fn parse_privileges(&mut self) -> Result<Ddl> {
        let grant = self.parse_word("GRANT");
        if !grant {
            self.parser.next_token(); // REVOKE
        }
        let privileges = if self.parse_word("ALL") {
            self.parse_word("PRIVILEGES");
            Privilege::ALL.to_vec()
        } else {
            let mut privileges = Vec::new();
            loop {
                let privilege = match self.parser.parse_one_of_keywords(&[
                    Keyword::SELECT,
                    Keyword::INSERT,
                    Keyword::UPDATE,
                    Keyword::DELETE,
                ]) {
                    Some(Keyword::SELECT) => Privilege::Select,
                    Some(Keyword::INSERT) => Privilege::Insert,
                    Some(Keyword::UPDATE) => Privilege::Update,
                    Some(Keyword::DELETE) => Privilege::Delete,
                    _ => {
                        return Err(self.unexpected("ALL, SELECT, INSERT, UPDATE or DELETE"));
                    }
                };
                privileges.push(privilege);
                if !self.parser.consume_token(&Token::Comma) {
                    break;
                }
            }
            privileges
        };
        self.parser.expect_keyword_is(Keyword::ON)?;
        let _ = self.parser.parse_keyword(Keyword::TABLE);
        let object = object_name(&self.parser.parse_object_name(false)?)?;
        match grant {
            true => self.parser.expect_keyword_is(Keyword::TO)?,
            false => self.parser.expect_keyword_is(Keyword::FROM)?,
        }
        let user = normalize_ident(&self.parser.parse_identifier()?);
        Ok(Ddl::Privileges {
            object,
            user,
            privileges,
            grant,
        })
    }
}
